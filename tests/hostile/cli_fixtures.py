"""Fixture catalog and AWS stand-in for driving ``btk`` in-process with hostile arguments.

The profile and environments here are test machinery: every valid argument the hostile
tests use names them, so the tests hold whatever the user keeps in ``profiles/`` and
``environments.py``. The SageMaker stand-in answers every call with "nothing there" and
records it, so no command reaches the network.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from typing import Any

import botocore.session
import pytest
from botocore.exceptions import ClientError

from btk import capacity, catalog
from btk.cli import main
from btk.environment import EnvironmentConfig, ReservePlanCapacity
from btk.profile import ModelArchitecture, ModelProfile, TrainingIntent
from btk.report import aws

PROFILE = ModelProfile(
    name="tiny-hostile",
    family="t",
    architecture=ModelArchitecture(
        num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=128,
        vocab_size=256, max_context=256,
    ),
    training=TrainingIntent(seq_len=64, global_batch_tokens=64 * 1024),
)  # fmt: skip
RESERVE_START = datetime(2031, 1, 6, tzinfo=UTC)
ON_DEMAND_ENV = EnvironmentConfig(
    name="hostile-od", availability_zone="us-east-1a", profiles=(PROFILE.name,), instance_count=2
)
RESERVE_ENV = EnvironmentConfig(
    name="hostile-rsv",
    availability_zone="us-east-1a",
    profiles=(PROFILE.name,),
    instance_count=2,
    capacity=ReservePlanCapacity(
        start_after=RESERVE_START, duration_hours=168, instance_count=2, max_upfront_fee=1000, purchase_approved=True
    ),
)
ENVIRONMENTS = {env.name: env for env in (ON_DEMAND_ENV, RESERVE_ENV)}
#: Read once: loading botocore's service model each time would dominate a fuzz run.
SOLD_AS_PLANS = cache(capacity.plan_instance_types)


@cache
def empty_answer(operation: str) -> dict[str, Any]:
    """The documented answer of a SageMaker operation with nothing in it: every required list empty
    (``{}`` for an operation SageMaker does not have: the doctor asks the stand-in for other services too)."""
    api = "".join(part.capitalize() for part in operation.split("_"))
    model = _sagemaker_model()
    if api not in model.operation_names:
        return {}
    shape = model.operation_model(api).output_shape
    return {name: [] for name in shape.required_members if shape.members[name].type_name == "list"}


@cache
def _sagemaker_model() -> Any:
    return botocore.session.get_session().get_service_model("sagemaker")


@dataclass
class EmptySageMaker:
    """A SageMaker client with nothing in it: no offerings, plans, pipelines or jobs."""

    calls: list[str] = field(default_factory=list)

    def describe_training_plan(self, **parameters: Any) -> dict[str, Any]:
        self.calls.append("describe_training_plan")
        error = {"Error": {"Code": "ResourceNotFound", "Message": "no such plan"}}
        raise ClientError(error, "DescribeTrainingPlan")

    def start_pipeline_execution(self, **parameters: Any) -> dict[str, Any]:
        """Starting answers an execution (of a pipeline that then has nothing to show)."""
        self.calls.append("start_pipeline_execution")
        name = parameters.get("PipelineName", "none")
        return {"PipelineExecutionArn": f"arn:aws:sagemaker:us-east-1:123456789012:pipeline/{name}/execution/empty"}

    def __getattr__(self, operation: str) -> Any:
        if operation.startswith("_"):
            raise AttributeError(operation)

        def empty(**parameters: Any) -> dict[str, Any]:
            self.calls.append(operation)
            return dict(empty_answer(operation))

        return empty


def install(monkeypatch: pytest.MonkeyPatch) -> EmptySageMaker:
    """Point the catalog at the fixtures and every AWS client factory at one :class:`EmptySageMaker`."""
    client = EmptySageMaker()
    monkeypatch.setattr(catalog, "all_profiles", lambda: {PROFILE.name: PROFILE})
    monkeypatch.setattr(catalog, "all_environments", lambda: dict(ENVIRONMENTS))
    monkeypatch.setattr("btk.cli.capacity.sagemaker_client", lambda region: client)
    monkeypatch.setattr("btk.cli.rehearse.sagemaker_client", lambda region: client)
    monkeypatch.setattr("btk.cli.evidence.aws_clients", lambda region: lambda service: client)
    monkeypatch.setattr(capacity, "plan_instance_types", SOLD_AS_PLANS)
    monkeypatch.setattr(aws, "make_client", lambda region: client)
    return client


@dataclass(frozen=True)
class Outcome:
    code: int
    out: str
    err: str


def btk(capsys: pytest.CaptureFixture[str], argv: list[str]) -> Outcome:
    """Run ``btk argv`` in-process; any exception but SystemExit escapes (and fails the test)."""
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
    captured = capsys.readouterr()
    return Outcome(code, captured.out, captured.err)


def assert_one_line_error(outcome: Outcome) -> None:
    """Exit 2, nothing on stdout, exactly one line on stderr starting ``btk``."""
    assert outcome.code == 2, outcome
    assert outcome.out == "", outcome
    assert outcome.err.startswith("btk") and outcome.err.endswith("\n") and outcome.err.count("\n") == 1, outcome
