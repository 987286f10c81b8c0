"""``btk doctor`` on generated answers of every operation it reads, from botocore's models of their services.

Each case runs ``btk doctor`` for an on-demand and a reserve environment (fixture catalog: FSx checks,
a training plan), every call answered at that moment by :mod:`aws_answers` (the operation's output
shape walked and filled, hints steering the answers into the paths that read deeper: the caller's
account, quota names, a Lustre file system, a deployed stack with its outputs; one answer in six
corrupted out of its shape at one node). Whatever it is served:

- no traceback: exit 0 or 1 with a report, or exit 2 with one line;
- every answer served outside its documented shape is named in the output as
  ``<action> answered outside its documented shape``: its checks warn, none passes on it;
- answers inside their shapes never reach the doctor's fallback for unreadable answers, and never
  end the run with exit 2 but for an identity without its account (the model makes every member
  of ``GetCallerIdentity`` optional);
- it never loops: the stand-in fails past :data:`MAX_CALLS` calls.

The stand-in's clients carry real botocore clients' ``meta`` (the action names are AWS's own); answers
are handed over as botocore's parser would, without its validation, so a corrupted one reaches btk.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import botocore.session
import pytest
from aws_answers import CORRUPTIONS, Generated, answers
from cli_fixtures import ENVIRONMENTS, ON_DEMAND_ENV, PROFILE, RESERVE_ENV, btk
from example_budget import capped
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from btk import catalog

ACCOUNT = "123456789012"
CALLER_ARN = f"arn:aws:sts::{ACCOUNT}:assumed-role/btk-doctor/fuzz"
IDENTITY = {"Account": ACCOUNT, "Arn": CALLER_ARN, "UserId": "AROAEXAMPLE:fuzz"}
#: More calls than any doctor run makes on a healthy account (about 20): past it, something loops.
MAX_CALLS = 150
QUOTA_NAMES = (
    "ml.p6-b200.48xlarge for training job usage", "ml.p6-b200.48xlarge for spot training job usage",
    "Maximum number of instances per training job", "Number of instances across all training jobs",
    "Longest run time for a training job", "Lustre Persistent_2 storage capacity", "Lustre Persistent_2 file systems",
)  # fmt: skip
#: A listing's page token: usually none; a second page is asked for with a token it then repeats.
PAGE_TOKENS = st.sampled_from(["", "", "", "page-2"])
#: Member values that steer each operation's answers into the paths that read deeper.
HINTS: dict[tuple[str, str], dict[str, st.SearchStrategy[Any]]] = {
    ("sts", "get_caller_identity"): {"Account": st.just(ACCOUNT), "Arn": st.just(CALLER_ARN)},
    ("ssm", "get_parameter"): {"Value": st.sampled_from(["30", "6", "5", "x"])},
    ("service-quotas", "list_service_quotas"): {"QuotaName": st.sampled_from(QUOTA_NAMES), "NextToken": PAGE_TOKENS},
    ("service-quotas", "list_aws_default_service_quotas"): {
        "QuotaName": st.sampled_from(QUOTA_NAMES), "NextToken": PAGE_TOKENS},
    ("fsx", "describe_file_systems"): {
        "FileSystemType": st.just("LUSTRE"), "DeploymentType": st.just("PERSISTENT_2"), "NextToken": PAGE_TOKENS},
    ("cloudformation", "describe_stacks"): {
        "StackStatus": st.sampled_from(["CREATE_COMPLETE", "UPDATE_COMPLETE", "ROLLBACK_COMPLETE"]),
        "Outputs": st.just([
            {"OutputKey": "ImageUri", "OutputValue": f"{ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com/btk:abc"},
            {"OutputKey": "FailureTopicArn", "OutputValue": f"arn:aws:sns:us-east-1:{ACCOUNT}:btk-failures"},
        ]),
        "NextToken": PAGE_TOKENS,
    },
    ("cloudformation", "get_template"): {"TemplateBody": st.just('{"Resources": {}}')},
    ("sns", "list_subscriptions_by_topic"): {
        "SubscriptionArn": st.sampled_from(["PendingConfirmation", f"arn:aws:sns:us-east-1:{ACCOUNT}:t:1"]),
        "NextToken": PAGE_TOKENS},
    ("sagemaker", "describe_training_plan"): {
        "Status": st.sampled_from(["Active", "Scheduled", "Failed"]), "InstanceType": st.just("ml.p6-b200.48xlarge")},
}  # fmt: skip


@cache
def _meta(service: str) -> Any:
    """A real client's ``meta`` (service model, IAM names of its methods), made offline once."""
    client = botocore.session.get_session().create_client(
        service, region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing"
    )
    return client.meta


@dataclass
class Client:
    account: GeneratedAccount
    service: str

    @property
    def meta(self) -> Any:
        return _meta(self.service)

    def __getattr__(self, operation: str) -> Callable[..., Any]:
        if operation.startswith("_"):
            raise AttributeError(operation)
        return lambda **params: self.account.answer(self.service, operation)


@dataclass
class GeneratedAccount:
    """Every call answered as it is made: generated, or ``fixed`` for the operations it names."""

    data: st.DataObject | None
    corrupt: int = 6
    always: str | None = None
    fixed: dict[tuple[str, str], Any] = field(default_factory=dict)
    served: list[tuple[str, str, Generated]] = field(default_factory=list)

    def client(self, service: str) -> Client:
        return Client(self, service)

    def answer(self, service: str, operation: str) -> Any:
        assert len(self.served) < MAX_CALLS, f"more than {MAX_CALLS} calls: {self.served[-5:]}"
        if (service, operation) in self.fixed:
            generated = Generated(self.fixed[(service, operation)])
        else:
            assert self.data is not None, f"no answer for {service} {operation}"
            identity = (service, operation) == ("sts", "get_caller_identity")
            generated = self.data.draw(answers(
                operation, HINTS.get((service, operation)), corrupt=0 if identity else self.corrupt,
                always=None if identity else self.always, service=service,
            ))  # fmt: skip
        self.served.append((service, operation, generated))
        return copy.deepcopy(generated.value)

    def action(self, service: str, operation: str) -> str:
        meta = _meta(service)
        return f"{meta.service_model.signing_name}:{meta.method_to_api_mapping[operation]}"


@pytest.fixture
def doctor_run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., Any]:
    monkeypatch.setattr(catalog, "all_profiles", lambda: {PROFILE.name: PROFILE})
    monkeypatch.setattr(catalog, "all_environments", lambda: dict(ENVIRONMENTS))
    monkeypatch.setattr("time.sleep", lambda seconds: None)

    def run(account: GeneratedAccount, env: str) -> Any:
        monkeypatch.setattr("btk.doctor.aws.client_factory", lambda region, credentials=None: account.client)
        return btk(capsys, ["doctor", "--env", env])

    return run


#: Members botocore's own handlers deliver decoded (botocore.handlers.json_decode_template_body parses a JSON
#: template body): an object there is what a caller gets for a JSON body, inside the shape as delivered.
DELIVERED_DECODED = {("cloudformation", "get_template"): "TemplateBody"}


def outside(service: str, operation: str, generated: Generated) -> bool:
    """Whether the answer is outside its documented shape as botocore delivers it to btk."""
    member = DELIVERED_DECODED.get((service, operation))
    if member is not None and isinstance(generated.value, dict) and isinstance(generated.value.get(member), dict):
        return False
    return generated.outside


def check_outcome(account: GeneratedAccount, outcome: Any) -> None:
    """The properties of the module docstring, for one run."""
    text = outcome.out + outcome.err
    assert outcome.code in (0, 1, 2), outcome
    if outcome.code == 2:
        assert outcome.out == "" and outcome.err.count("\n") == 1 and outcome.err.startswith("btk"), outcome
    else:
        assert outcome.err == "" and outcome.out.strip(), outcome
    bad = [(service, operation, generated) for service, operation, generated in account.served
           if outside(service, operation, generated)]
    for service, operation, generated in bad:
        named = f"{account.action(service, operation)} answered outside its documented shape"
        assert named in text, (generated.corruption, text)
    if not bad:  # every member of an identity is optional: one without an account is the one in-shape stop
        assert outcome.code in (0, 1) or "sts:GetCallerIdentity answered without an account" in outcome.err, outcome
        assert "not in the documented shape" not in text, text  # the fallback for answers the code misread


def run_many(test: Callable[..., None], examples: int) -> None:
    """``test`` on ``examples`` generated cases, unshrunk: a case draws a dozen answers and reruns the doctor,
    so shrinking takes minutes; the report lists every answer the failing case drew."""
    settings(
        max_examples=capped(examples), deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    )(test)()  # fmt: skip


@pytest.mark.parametrize("env", [ON_DEMAND_ENV.name, RESERVE_ENV.name])
def test_btk_doctor_on_generated_answers(env: str, doctor_run: Callable[..., Any]) -> None:
    @given(data=st.data())
    def case(data: st.DataObject) -> None:
        account = GeneratedAccount(data)
        check_outcome(account, doctor_run(account, env))

    run_many(case, 60)


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_btk_doctor_names_every_call_answered_out_of_shape_each_way(kind: str, doctor_run: Callable[..., Any]) -> None:
    """Every answer but the identity corrupted ``kind``'s way: each check warns, naming its call."""

    @given(data=st.data())
    def case(data: st.DataObject) -> None:
        account = GeneratedAccount(data, always=kind, fixed={("sts", "get_caller_identity"): IDENTITY})
        outcome = doctor_run(account, RESERVE_ENV.name)
        check_outcome(account, outcome)
        assert outcome.code in (0, 1) and "PASS" not in outcome.out, outcome

    run_many(case, 10)


def _lustre(storage: Any) -> dict[str, Any]:
    return {
        "FileSystemId": "fs-0123456789abcdef0", "FileSystemType": "LUSTRE", "StorageCapacity": storage,
        "LustreConfiguration": {"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 250},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("storage", "said"),
    [(-995_200, "below its documented minimum 0"), (1e400, "not a whole number"), (2**31, "beyond a 32-bit")],
)
def test_a_file_system_of_impossible_size_is_not_counted(
    storage: Any, said: str, doctor_run: Callable[..., Any]
) -> None:
    """FSx answering a negative, infinite or too large size: the checks that count the account's file systems
    warn naming the member; none passes on it."""
    account = GeneratedAccount(None, fixed={
        ("sts", "get_caller_identity"): IDENTITY,
        ("service-quotas", "list_service_quotas"): {"Quotas": []},
        ("service-quotas", "list_aws_default_service_quotas"): {"Quotas": []},
        ("ssm", "get_parameter"): {"Parameter": {"Name": "/cdk-bootstrap/x/version", "Value": "30"}},
        ("fsx", "describe_file_systems"): {"FileSystems": [_lustre(storage)]},
        ("cloudformation", "describe_stacks"): {"Stacks": []},
    })  # fmt: skip
    outcome = doctor_run(account, ON_DEMAND_ENV.name)
    lustre = [line for line in outcome.out.splitlines() if re.search("Lustre .*(storage capacity|file systems)", line)]
    assert len(lustre) == 2 and all(line.startswith("WARN ") for line in lustre), outcome.out
    assert all(re.search(rf"fsx:DescribeFileSystems answered outside its documented shape: "
                         rf"FileSystems\[0\]\.StorageCapacity .*{said}", line) for line in lustre), lustre
