"""Every SageMaker call of the reservation Lambda, ``btk capacity`` and ``btk report``, on generated answers.

Each case runs three flows (deploys of the reservation custom resource, or ``btk`` commands), every
call answered at that moment by :mod:`aws_answers` (botocore's output shape of the operation,
walked and filled; one answer in six to ten corrupted out of it at one node), with listings whose
page tokens repeat or go missing, one listing in forty never ending, and offerings that differ from
the request in one field or more (instance type or count, currency, duration, start, end, AZ,
target, fee, an id listed twice). Whatever it is served:

- the code never raises anything but its one-line error: the Lambda a ``CapacityError`` (the
  resource's FAILED reason), the CLI exit 2 with one line on stderr; no traceback;
- it never hangs: the stand-in counts calls and fails past a bound; a listing that never ends stops
  at the page limit;
- the first answer outside its documented shape, the first repeated page token or the page limit
  ends the flow with one line naming that call, and no call follows it;
- an answer inside its shape is never called outside it, and ``btk report`` then reports (exit 0);
- nothing is bought but an offering that matches the request in every field (checked here from the
  request and the raw offering, not by the code under test), and a matching offering is bought
  when nothing else stands in the way (approved, no plan of that name, no live plan of the
  environment).

Each suite prints its counts (``pytest -s`` shows them: about 2,600 generated answers in all in a
typical run). No test asserts a count, which depends on generation, not on the code: beside each
suite, tests that serve every answer corrupted one way (null, a wrong value, a required member
deleted) prove that each kind is drawn and handled, and in-shape tests prove that a matching
offering is bought and that every job found is described.
"""

from __future__ import annotations

import copy
import importlib.util
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from aws_answers import CORRUPTIONS, Generated, answers, api_name, model, valid
from botocore.exceptions import ClientError
from cli_fixtures import ENVIRONMENTS, ON_DEMAND_ENV, PROFILE, RESERVE_ENV, RESERVE_START, btk, install
from example_budget import capped
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from btk import capacity, catalog
from btk.environment import EnvironmentConfig, ExistingPlanCapacity
from btk.hyperparameters import JobHyperparameters, JobSettings, to_hyperparameters
from btk.knobs import TrainingKnobs
from btk.metrics import METRICS
from btk.pagination import MAX_PAGES
from btk.report import aws


def load_handler() -> ModuleType:
    """``training_constructs/lambda/training_plan/index.py`` (``lambda`` is a keyword: no import)."""
    path = Path(__file__).resolve().parents[2] / "training_constructs" / "lambda" / "training_plan" / "index.py"
    spec = importlib.util.spec_from_file_location("training_plan_handler_hostile", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


handler = load_handler()

AZ = RESERVE_ENV.availability_zone
INSTANCE = RESERVE_ENV.instance_type
COUNT = 2
HOURS = 168
START = RESERVE_START
ENVIRONMENT = "prod"
ACCOUNT = "123456789012"
NOW = datetime.now(UTC)
#: Every fee text an offering or a plan is generated with, and its value (None: no fee can be read).
FEES: dict[str, float | None] = {
    "90000.00": 90000.0, "120,000.50": 120000.5, "150000": 150000.0, "150000.01": 150000.01, "0": 0.0,
    "1e5": None, "150.000,50": None, "call us": None, "": None, "-5": None, "inf": None,
}  # fmt: skip
CEILING = 150_000.0
#: Shape-outside and endless-listing lines the code gives: never for an answer inside its shape.
ANSWER_PROBLEMS = ("answered outside its documented shape", "repeated a page token", "gave more than")


def weighted(usual: Any, *others: Any, weight: int = 12) -> st.SearchStrategy[Any]:
    """``usual`` ``weight`` times as often as each of ``others``."""
    return st.sampled_from([usual] * weight + list(others))


def plan_arn(name: str) -> str:
    return f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:training-plan/{name}"


def shape(name: str) -> Any:
    return model().shape_for(name)


# --------------------------------------------------------------------------- the stand-in account

NOT_FOUND = "not found"
#: The listings: their items' key and the pages the code may follow.
LISTINGS = {
    "list_training_plans": ("TrainingPlanSummaries", capacity.LIST_PLANS_MAX_PAGES),
    "list_pipeline_executions": ("PipelineExecutionSummaries", MAX_PAGES),
    "list_pipeline_execution_steps": ("PipelineExecutionSteps", MAX_PAGES),
    "search": ("Results", MAX_PAGES),
}
CALL_LIMIT = 4 * MAX_PAGES
#: One listing in this many never ends.
ENDLESS_ONE_IN = 40


@dataclass
class Account:
    """Answers each call with an answer drawn for it at that moment (so a case costs what it is served):
    ``answers`` holds each operation's strategy (a listing's: of one page); the first page of a listing
    decides, one time in :data:`ENDLESS_ONE_IN`, that the listing never ends. Records what it served: how many answers,
    and the first that should have ended the flow."""

    data: st.DataObject
    strategies: dict[str, st.SearchStrategy[Any]]
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    answered: dict[str, list[Any]] = field(default_factory=dict)
    served: Counter[str] = field(default_factory=Counter)
    first_bad: str | None = None
    after_bad: list[str] = field(default_factory=list)
    tokens: dict[str, list[str]] = field(default_factory=dict)
    endless: dict[str, bool] = field(default_factory=dict)

    def __getattr__(self, operation: str) -> Any:
        if operation.startswith("_") or operation not in self.strategies:
            raise AttributeError(operation)
        return lambda **parameters: self._answer(operation, parameters)

    def _answer(self, operation: str, parameters: dict[str, Any]) -> Any:
        assert len(self.calls) < CALL_LIMIT, "the code kept calling SageMaker: it would hang"
        if self.first_bad is not None:
            self.after_bad.append(operation)
        self.calls.append((operation, parameters))
        if operation in LISTINGS:
            return self._page(operation, parameters)
        item = self._draw(operation)
        if item == NOT_FOUND:
            raise ClientError({"Error": {"Code": "ResourceNotFound", "Message": "no such plan"}}, api_name(operation))
        return self._serve(operation, item)

    def _draw(self, operation: str) -> Any:
        item = self.data.draw(self.strategies[operation], label=operation)
        self.answered.setdefault(operation, []).append(item)
        return item

    def _serve(self, operation: str, generated: Generated, kind: str = "generated") -> Any:
        self.served[kind] += 1
        self.served["corrupted" if generated.outside else "in shape"] += kind == "generated"
        if generated.outside:
            self._bad(f"sagemaker:{api_name(operation)} answered outside its documented shape")
        return copy.deepcopy(generated.value)

    def _page(self, operation: str, parameters: dict[str, Any]) -> Any:
        key, limit = LISTINGS[operation]
        if "NextToken" not in parameters:
            self.tokens[operation] = []
            self.endless[operation] = self.data.draw(st.sampled_from([False] * (ENDLESS_ONE_IN - 1) + [True]))
        given = self.tokens[operation]
        assert parameters.get("NextToken") == (given[-1] if given else None), "asked for a page not given"
        if self.endless[operation]:
            page = Generated({key: [], "NextToken": f"page-{len(given) + 1}"})
            served = self._serve(operation, page, "endless page")
        else:
            page = self._draw(operation)
            served = self._serve(operation, page)
        token = page.value.get("NextToken") if not page.outside else None
        if isinstance(token, str) and token:
            if token in given:
                self._bad(f"sagemaker:{api_name(operation)} repeated a page token")
            elif len(given) + 1 >= limit:
                self._bad(f"sagemaker:{api_name(operation)} gave more than {limit} pages")
            given.append(token)
        return served

    def _bad(self, line: str) -> None:
        if self.first_bad is None:
            self.first_bad = line

    def served_in_shape(self, operation: str) -> list[Any]:
        """The values of the answers served for ``operation`` inside their shape, in order."""
        return [
            item.value for item in self.answered.get(operation, []) if isinstance(item, Generated) and not item.outside
        ]


TOKENS = {"NextToken": weighted("", "t1", "t2", "t3", weight=6)}


# --------------------------------------------------------------------------- training plans

BLOCK = {
    "InstanceType": weighted(INSTANCE, "ml.p5.48xlarge"),
    "InstanceCount": weighted(COUNT, 1, 4),
    "AvailabilityZone": weighted(AZ, "us-east-1b"),
    "StartTime": weighted(START, START - timedelta(hours=1), START + timedelta(days=1)),
    "EndTime": weighted(START + timedelta(hours=HOURS), START + timedelta(hours=HOURS + 1), START + timedelta(days=30)),
}
OFFERING: dict[str, st.SearchStrategy[Any]] = {
    "TrainingPlanOfferingId": st.sampled_from([f"tpo-{index}" for index in range(12)]),
    "TargetResources": weighted(["training-job"], ["hyperpod-cluster"], ["hyperpod-cluster", "training-job"]),
    "DurationHours": weighted(HOURS, HOURS + 24, 24),
    "DurationMinutes": weighted(0, 30),
    "CurrencyCode": weighted("USD", "EUR", "", "usd"),
    "UpfrontFee": st.sampled_from(["90000.00"] * 6 + ["120,000.50"] * 6 + list(FEES)),
    # one capacity block first (the simplest draw), sometimes none or several
    "ReservedCapacityOfferings": st.lists(valid(shape("ReservedCapacityOffering"), BLOCK), min_size=1, max_size=1)
    | st.lists(valid(shape("ReservedCapacityOffering"), BLOCK), max_size=3),
}
# offerings with distinct ids first, sometimes with an id listed twice
OFFERING["TrainingPlanOfferings"] = st.lists(
    valid(shape("TrainingPlanOffering"), OFFERING), max_size=4, unique_by=lambda item: item["TrainingPlanOfferingId"]
) | st.lists(valid(shape("TrainingPlanOffering"), OFFERING), min_size=2, max_size=4)
#: Plans: the reservation's own, another of the environment's, another environment's, a team's.
PLAN_NAMES = ("btk-prod-0badc0de", "btk-prod-eu-0badc0de", "team-plan")
PLAN: dict[str, st.SearchStrategy[Any]] = {
    "TrainingPlanName": st.sampled_from(PLAN_NAMES),
    "TrainingPlanArn": st.sampled_from([plan_arn(name) for name in PLAN_NAMES]),
    "Status": st.sampled_from(["Pending", "Active", "Scheduled", "Expired", "Failed", "Paused"]),
    "EndTime": st.sampled_from([datetime(2020, 1, 1, tzinfo=UTC), START + timedelta(days=30)]),
    "UpfrontFee": st.sampled_from(list(FEES)),
    "CurrencyCode": weighted("USD", "EUR", ""),
    "TotalInstanceCount": weighted(COUNT, 0, 1, 4),
    "TargetResources": weighted(["training-job"], ["hyperpod-cluster"]),
    "InstanceType": BLOCK["InstanceType"],
    "AvailabilityZone": BLOCK["AvailabilityZone"],
}
PLAN["ReservedCapacitySummaries"] = st.lists(valid(shape("ReservedCapacitySummary"), PLAN), max_size=2)
PLAN["TrainingPlanSummaries"] = st.lists(valid(shape("TrainingPlanSummary"), PLAN), max_size=3)
PLAN_LISTING = {**PLAN, **TOKENS}


def matches(item: dict[str, Any], request: capacity.ReservationRequest, ids: list[str]) -> bool:
    """Whether a raw offering matches the request in every field (the rule, written from the request)."""
    blocks = item.get("ReservedCapacityOfferings", [])
    fee = FEES.get(item.get("UpfrontFee", ""))
    hours = item.get("DurationHours", 0) + item.get("DurationMinutes", 0) / 60
    placed = bool(blocks) and all(
        block.get("AvailabilityZone") == request.availability_zone
        and block["InstanceType"] == request.instance_type
        and block["InstanceCount"] == request.instance_count
        and "StartTime" in block
        and "EndTime" in block
        for block in blocks
    )
    return (
        ids.count(item["TrainingPlanOfferingId"]) == 1
        and "training-job" in item["TargetResources"]
        and placed
        and min(block["StartTime"] for block in blocks) >= request.start_after
        and (request.end_before is None or max(block["EndTime"] for block in blocks) <= request.end_before)
        and item.get("CurrencyCode") == "USD"
        and hours == request.duration_hours
        and fee is not None
        and fee <= CEILING
    )


def environment_holds_a_live_plan(account: Account, request: capacity.ReservationRequest) -> bool:
    """Whether a listed plan of the environment is live (not Failed/Expired, not ended): then nothing is bought."""
    own = {request.plan_name(), "btk-prod-0badc0de"}
    return any(
        plan["TrainingPlanName"] in own
        and plan["Status"] not in ("Failed", "Expired")
        and ("EndTime" not in plan or plan["EndTime"] > NOW)
        for page in account.served_in_shape("list_training_plans")
        for plan in page["TrainingPlanSummaries"]
    )


COUNTS: dict[str, Counter[str]] = {}
#: Flows (deploys, commands) per generated case: many answers per case keep the suite's run time modest.
FLOWS = 3


def tally(test: str, account: Account, **more: int) -> None:
    counts = COUNTS.setdefault(test, Counter())
    counts["cases"] += 1
    counts.update(account.served)
    counts.update(more)
    if account.first_bad:
        counts["ended in one line on a bad answer"] += 1


def report_counts(test: str) -> None:
    """Print what a suite was served (``pytest -s`` shows it). Nothing is asserted on the counts: how many
    answers a run draws depends on generation, not on the code; that every kind of answer is drawn and
    handled is proved by the forced-corruption and in-shape tests below each suite."""
    counts = COUNTS[test]
    print(f"\n{test}: " + ", ".join(f"{key} {value}" for key, value in sorted(counts.items())))


def first_served_corruption(account: Account) -> str:
    """The kind of the first answer served outside its shape."""
    for items in account.answered.values():
        for item in items:
            if isinstance(item, Generated) and item.outside:
                assert item.kind is not None
                return item.kind
    raise AssertionError("no answer outside its shape was served")


def run_many(test: Callable[..., None], examples: int) -> None:
    settings(
        max_examples=capped(examples),
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    )(test)()


def one_line(line: str | None) -> bool:
    return line is not None and "\n" not in line and bool(line.strip())


def capacity_answers(found: int, always: str | None = None) -> dict[str, st.SearchStrategy[Any]]:
    """What the training-plan calls answer: DescribeTrainingPlan finds a plan one time in ``found``;
    ``always`` corrupts every answer that way (:data:`aws_answers.CORRUPTIONS`)."""
    describe = answers("describe_training_plan", PLAN, always=always)
    return {
        "describe_training_plan": st.integers(1, found).flatmap(
            lambda n: describe if n == found else st.just(NOT_FOUND)
        ),
        "list_training_plans": answers("list_training_plans", PLAN_LISTING, corrupt=10, always=always),
        "search_training_plan_offerings": answers("search_training_plan_offerings", OFFERING, corrupt=6,
                                                  always=always),
        "create_training_plan": answers("create_training_plan", {"TrainingPlanArn": st.just(plan_arn("x"))}, corrupt=8,
                                        always=always),
    }


LAMBDA_ANSWERS = capacity_answers(found=5)


@dataclass(frozen=True)
class LambdaCase:
    mode: str
    end_before: datetime | None
    approved: bool

    def properties(self) -> dict[str, str]:
        common = {
            "Environment": ENVIRONMENT,
            "InstanceType": INSTANCE,
            "InstanceCount": str(COUNT),
            "AvailabilityZone": AZ,
        }
        if self.mode == "existing":
            return {**common, "Mode": "existing", "PlanArn": plan_arn("team-plan")}
        return {
            **common,
            "Mode": "reserve",
            "StartAfter": capacity.iso(START),
            "EndBefore": capacity.iso(self.end_before) if self.end_before else "",
            "DurationHours": str(HOURS),
            "MaxUpfrontFee": str(CEILING),
            "PurchaseApproved": str(self.approved).lower(),
            "WaitSeconds": "600",
        }


LAMBDA_CASES = st.builds(
    LambdaCase,
    mode=weighted("reserve", "existing", weight=5),
    end_before=st.sampled_from([None, START + timedelta(days=9), START + timedelta(hours=HOURS)]),
    approved=weighted(True, False, weight=5),
)


#: isComplete calls per deploy at most (the Provider framework polls until complete, an error or its timeout).
POLLS = 4


def run_lambda(case: LambdaCase, account: Account) -> str | None:
    """onEvent (Create), then isComplete until complete (at most :data:`POLLS` times), as the Provider
    framework calls them; the failure line, if any."""
    event = {"RequestType": "Create", "LogicalResourceId": "Plan", "ResourceProperties": case.properties()}
    try:
        response = handler.handle(event, account, clock=lambda: 0.0)
        polled = {**event, "PhysicalResourceId": response["PhysicalResourceId"], "Data": response["Data"]}
        for _ in range(POLLS):
            if handler.check_complete(polled, account, clock=lambda: 0.0)["IsComplete"]:
                break
    except capacity.CapacityError as error:
        return str(error)
    return None


def check_purchase(account: Account, case: LambdaCase) -> tuple[int, int]:
    """(matching offerings served, offerings bought); fails on a purchase of anything that does not match,
    and when a matching offering was not bought although nothing stood in the way."""
    bought = [call["TrainingPlanOfferingId"] for called, call in account.calls if called == "create_training_plan"]
    if case.mode == "existing":
        assert bought == [], "bought a plan in existing mode"
        return 0, 0
    request = capacity.ReservationRequest.from_properties(case.properties())
    offerings = [item for answer in account.served_in_shape("search_training_plan_offerings")
                 for item in answer["TrainingPlanOfferings"]]  # fmt: skip
    ids = [item["TrainingPlanOfferingId"] for item in offerings]
    matching = [item for item in offerings if matches(item, request, ids)]
    for offering_id in bought:
        chosen = [item for item in offerings if item["TrainingPlanOfferingId"] == offering_id]
        assert len(chosen) == 1 and matches(chosen[0], request, ids), ("bought a mismatched offering", chosen, request)
    free_to_buy = (
        case.approved
        and account.answered["describe_training_plan"][0] == NOT_FOUND
        and not environment_holds_a_live_plan(account, request)
    )
    if free_to_buy and matching:
        assert len(bought) == 1, ("a matching offering was not bought", matching)
    return len(matching), len(bought)


def test_the_reservation_lambda_on_generated_answers(capsys: pytest.CaptureFixture[str]) -> None:
    @given(cases=st.lists(LAMBDA_CASES, min_size=FLOWS, max_size=FLOWS), data=st.data())
    def deploys(cases: list[LambdaCase], data: st.DataObject) -> None:
        for case in cases:
            account = Account(data, LAMBDA_ANSWERS)
            line = run_lambda(case, account)
            if account.first_bad is not None:
                assert one_line(line) and line is not None and line.startswith(account.first_bad), (
                    account.first_bad,
                    line,
                )
            elif line is not None:
                assert one_line(line) and not any(problem in line for problem in ANSWER_PROBLEMS), line
            assert account.after_bad == [], ("called SageMaker after a bad answer", account.after_bad)
            matching, bought = check_purchase(account, case)
            tally(
                "lambda",
                account,
                **{"matching offerings served": matching, "purchases": bought, "purchases of a mismatched offering": 0},
            )
        capsys.readouterr()  # the handler's log lines

    run_many(deploys, 300)
    report_counts("lambda")


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_the_reservation_lambda_ends_in_one_line_on_each_kind_of_bad_answer(
    kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every answer corrupted ``kind``'s way: the first call's answer ends the deploy in one line naming it,
    no call follows and nothing is bought."""
    strategies = capacity_answers(found=1, always=kind)

    @given(case=LAMBDA_CASES, data=st.data())
    def deploys(case: LambdaCase, data: st.DataObject) -> None:
        account = Account(data, strategies)
        line = run_lambda(case, account)
        assert account.first_bad is not None and first_served_corruption(account) == kind
        assert one_line(line) and line is not None and line.startswith(account.first_bad), (account.first_bad, line)
        assert account.after_bad == [] and len(account.calls) == 1, account.calls
        capsys.readouterr()

    run_many(deploys, 12)


def test_the_reservation_lambda_buys_the_one_offering_that_matches() -> None:
    """In-shape answers, no plan of that name, approved, an offering that matches in every field among
    others: one matching offering is bought, once."""
    exact = {
        "TrainingPlanOfferingId": "tpo-match", "TargetResources": ["training-job"], "DurationHours": HOURS,
        "DurationMinutes": 0, "CurrencyCode": "USD", "UpfrontFee": "90000.00",
        "ReservedCapacityOfferings": [{"InstanceType": INSTANCE, "InstanceCount": COUNT, "AvailabilityZone": AZ,
                                       "StartTime": START, "EndTime": START + timedelta(hours=HOURS)}],
    }  # fmt: skip
    others = valid(shape("TrainingPlanOffering"), {**OFFERING, "TrainingPlanOfferingId": st.just("tpo-other")})
    strategies = {
        "describe_training_plan": st.just(NOT_FOUND),
        "list_training_plans": answers("list_training_plans", {**PLAN_LISTING, "TrainingPlanSummaries": st.just([]),
                                                               "NextToken": st.just("")}, corrupt=0),
        "search_training_plan_offerings": answers("search_training_plan_offerings", {
            **OFFERING, "NextToken": st.just(""),
            "TrainingPlanOfferings": st.lists(others, max_size=2).map(lambda more: [copy.deepcopy(exact), *more])},
            corrupt=0),
        "create_training_plan": answers("create_training_plan", {"TrainingPlanArn": st.just(plan_arn("x"))}, corrupt=0),
    }  # fmt: skip

    @given(data=st.data())
    def deploys(data: st.DataObject) -> None:
        case = LambdaCase("reserve", None, True)
        account = Account(data, strategies)
        line = run_lambda(case, account)
        if account.first_bad is not None:  # a listing that never ends (one in forty): covered above
            assert one_line(line) and "gave more than" in account.first_bad, account.first_bad
            return
        matching, bought = check_purchase(account, case)
        assert matching >= 1 and bought == 1, (line, matching, bought)  # check_purchase: what is bought matches

    run_many(deploys, 12)


# --------------------------------------------------------------------------- btk capacity

EXISTING_ENV = EnvironmentConfig(
    name="hostile-ex",
    availability_zone=AZ,
    profiles=(PROFILE.name,),
    instance_count=2,
    capacity=ExistingPlanCapacity(plan_arn=plan_arn("team-plan")),
)
CLI_CAPACITY_ANSWERS = capacity_answers(found=2)
CAPACITY_COMMANDS = st.tuples(
    st.sampled_from(
        [
            ["capacity", "search", "--env", RESERVE_ENV.name, "--profile", PROFILE.name],
            ["capacity", "show", "--env", RESERVE_ENV.name],
            ["capacity", "show", "--env", EXISTING_ENV.name],
        ]
    ),
    st.sampled_from(["table", "json"]),
).map(lambda pair: [*pair[0], "--format", pair[1]])


def cli_outcome_holds(account: Account, outcome: Any, ok_codes: tuple[int, ...]) -> None:
    assert "Traceback" not in outcome.err, outcome
    if account.first_bad is not None:
        assert outcome.code == 2 and outcome.out == "" and outcome.err.count("\n") == 1, (account.first_bad, outcome)
        assert outcome.err.startswith(f"btk: error: {account.first_bad}"), (account.first_bad, outcome)
    elif outcome.code == 2:
        assert outcome.out == "" and outcome.err.count("\n") == 1, outcome
        assert not any(problem in outcome.err for problem in ANSWER_PROBLEMS), outcome
    else:
        assert outcome.code in ok_codes and outcome.out.strip(), outcome
    assert account.after_bad == [], ("called SageMaker after a bad answer", account.after_bad)


def run_command(
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    account: Account,
    connect: Callable[[Account], None],
    ok_codes: tuple[int, ...],
) -> Any:
    """``btk argv`` with ``connect`` pointing its client factory at ``account``; held to :func:`cli_outcome_holds`."""
    connect(account)
    outcome = btk(capsys, argv)
    cli_outcome_holds(account, outcome, ok_codes)
    return outcome


def test_btk_capacity_on_generated_answers(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    install(monkeypatch)
    monkeypatch.setattr(catalog, "all_environments", lambda: {**ENVIRONMENTS, EXISTING_ENV.name: EXISTING_ENV})

    @given(commands=st.lists(CAPACITY_COMMANDS, min_size=FLOWS, max_size=FLOWS), data=st.data())
    def runs(commands: list[list[str]], data: st.DataObject) -> None:
        for argv in commands:
            account = Account(data, CLI_CAPACITY_ANSWERS)
            run_command(capsys, argv, account, connect, (0, 1))
            tally("btk capacity", account)

    def connect(account: Account) -> None:
        monkeypatch.setattr("btk.cli.capacity.sagemaker_client", lambda region: account)

    run_many(runs, 100)
    report_counts("btk capacity")


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_btk_capacity_ends_in_one_line_on_each_kind_of_bad_answer(
    kind: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every answer corrupted ``kind``'s way: each command that calls SageMaker ends with exit 2 and one line
    naming the first call, and calls nothing after it."""
    install(monkeypatch)
    monkeypatch.setattr(catalog, "all_environments", lambda: {**ENVIRONMENTS, EXISTING_ENV.name: EXISTING_ENV})
    strategies = capacity_answers(found=1, always=kind)

    @given(argv=CAPACITY_COMMANDS, data=st.data())
    def runs(argv: list[str], data: st.DataObject) -> None:
        account = Account(data, strategies)
        outcome = run_command(capsys, argv, account, connect, (0, 1))
        if account.calls:
            assert account.first_bad is not None and first_served_corruption(account) == kind
            assert outcome.code == 2, outcome

    def connect(account: Account) -> None:
        monkeypatch.setattr("btk.cli.capacity.sagemaker_client", lambda region: account)

    run_many(runs, 12)


# --------------------------------------------------------------------------- btk report

JOB_NAMES = ("btk-hostile-od-a", "btk-hostile-od-b", "job-c")
JOB_ARNS = [f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:training-job/{name}" for name in JOB_NAMES]
EXECUTION_ARNS = [
    f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:pipeline/btk-hostile-od-tiny-hostile/execution/{name}" for name in "xy"
]
KNOB_SETS = [
    TrainingKnobs(micro_batch_size=1, seq_len=64, precision="bf16"),
    TrainingKnobs(micro_batch_size=2, gradient_accumulation_steps=2, seq_len=32, precision="mxfp8"),
]
HYPERPARAMETERS = [
    to_hyperparameters(
        JobHyperparameters(
            knobs=knobs,
            architecture=PROFILE.architecture,
            training=PROFILE.training,
            job=JobSettings(profile=PROFILE.name),
        )
    )
    for knobs in KNOB_SETS
]
RECENT = st.datetimes(datetime(2020, 1, 1), datetime(2030, 1, 1), timezones=st.just(UTC))
JOB: dict[str, st.SearchStrategy[Any]] = {
    "TrainingJobName": st.sampled_from(JOB_NAMES),
    "TrainingJobArn": st.sampled_from(JOB_ARNS),
    "CreationTime": RECENT,
    "TrainingEndTime": RECENT,
    "LastModifiedTime": RECENT,
    "HyperParameters": st.one_of(
        st.sampled_from(HYPERPARAMETERS), st.dictionaries(st.sampled_from(["job.profile", "x"]), st.text(max_size=8))
    ),
    "ResourceConfig": st.fixed_dictionaries(
        {},
        optional={
            "InstanceType": st.sampled_from([INSTANCE, "ml.p5.48xlarge", "ml.m5.large"]),
            "InstanceCount": st.sampled_from([1, 2, 0, 4096, 2**31 - 1]),
            "TrainingPlanArn": st.sampled_from([plan_arn(name) for name in PLAN_NAMES]),
        },
    ),
    "FinalMetricDataList": st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "MetricName": st.sampled_from([metric.sagemaker_name for metric in METRICS] + ["other"]),
                "Value": st.floats(allow_nan=False, allow_infinity=False),
                "Timestamp": RECENT,
            },
        ),
        max_size=4,
    ),
    "Tags": st.lists(
        st.fixed_dictionaries(
            {
                "Key": st.sampled_from(["btk:environment", "btk:profile", "project"]),
                "Value": st.sampled_from([ON_DEMAND_ENV.name, PROFILE.name, "", "x"]),
            }
        ),
        max_size=3,
    ),
}
JOB["TrainingJob"] = valid(shape("TrainingJob"), JOB)
STEPS: dict[str, st.SearchStrategy[Any]] = {
    **TOKENS,
    "Metadata": st.fixed_dictionaries(
        {}, optional={"TrainingJob": st.fixed_dictionaries({}, optional={"Arn": st.sampled_from(JOB_ARNS)})}
    ),
}


def report_answers(in_shape: bool = False, describes: str | None = None) -> dict[str, st.SearchStrategy[Any]]:
    """What ``btk report``'s calls answer: ``in_shape`` corrupts no listing and every search lists at least one
    named job; ``describes`` corrupts every Describe answer that way (:data:`aws_answers.CORRUPTIONS`)."""
    rare, often = (0, 0) if in_shape else (10, 8)
    tokens = {"NextToken": st.just("")} if in_shape else TOKENS
    search_hints = {**JOB, **tokens}
    search = answers("search", search_hints, corrupt=rare)
    if in_shape:
        named = st.tuples(valid(shape("TrainingJob"), JOB), st.sampled_from(JOB_NAMES)).map(
            lambda pair: {**pair[0], "TrainingJobName": pair[1]}
        )
        search_hints["Results"] = st.lists(st.fixed_dictionaries({"TrainingJob": named}), min_size=1, max_size=3)
        search = answers("search", search_hints, corrupt=0).filter(lambda answer: bool(answer.value.get("Results")))
    return {
        "list_pipeline_executions": answers(
            "list_pipeline_executions", {**tokens, "PipelineExecutionArn": st.sampled_from(EXECUTION_ARNS)},
            corrupt=rare,
        ),
        "list_pipeline_execution_steps": answers("list_pipeline_execution_steps", {**STEPS, **tokens}, corrupt=rare),
        "search": search,
        "describe_training_job": answers("describe_training_job", JOB, corrupt=often, always=describes),
        "describe_training_plan": answers("describe_training_plan", PLAN, corrupt=often, always=describes),
    }  # fmt: skip


REPORT_ANSWERS = report_answers()
REPORT_COMMANDS = st.sampled_from(["table", "markdown", "json"]).map(
    lambda output: ["report", "--env", ON_DEMAND_ENV.name, "--since", "2015-01-01", "--format", output]
)


def test_btk_report_on_generated_answers(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    install(monkeypatch)

    @given(commands=st.lists(REPORT_COMMANDS, min_size=FLOWS, max_size=FLOWS), data=st.data())
    def runs(commands: list[list[str]], data: st.DataObject) -> None:
        for argv in commands:
            account = Account(data, REPORT_ANSWERS)
            outcome = run_command(capsys, argv, account, connect, (0,))
            if account.first_bad is None:
                assert outcome.code == 0, ("answers inside their shape did not give a report", outcome)
            described = sum(called == "describe_training_job" for called, _ in account.calls)
            tally("btk report", account, **{"jobs described": described})

    def connect(account: Account) -> None:
        monkeypatch.setattr(aws, "make_client", lambda region: account)

    run_many(runs, 80)
    report_counts("btk report")


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_btk_report_ends_in_one_line_on_each_kind_of_bad_answer(
    kind: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Listings in shape that find jobs, every Describe answer corrupted ``kind``'s way: the first one ends the
    report with exit 2 and one line naming it, and nothing is called after it."""
    install(monkeypatch)
    strategies = report_answers(in_shape=True, describes=kind)

    @given(argv=REPORT_COMMANDS, data=st.data())
    def runs(argv: list[str], data: st.DataObject) -> None:
        account = Account(data, strategies)
        outcome = run_command(capsys, argv, account, connect, (0,))
        assert account.first_bad is not None, outcome
        if "DescribeTrainingJob" not in account.first_bad:  # a listing that never ends (one in forty)
            assert "gave more than" in account.first_bad, account.first_bad
            return
        assert first_served_corruption(account) == kind and outcome.code == 2, outcome
        assert account.calls[-1][0] == "describe_training_job"

    def connect(account: Account) -> None:
        monkeypatch.setattr(aws, "make_client", lambda region: account)

    run_many(runs, 12)


def test_btk_report_describes_every_job_it_finds(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """In-shape answers with jobs to find: every job the pipelines' steps or the tag search name is described
    exactly once, and the report succeeds."""
    install(monkeypatch)
    strategies = report_answers(in_shape=True)

    @given(argv=REPORT_COMMANDS, data=st.data())
    def runs(argv: list[str], data: st.DataObject) -> None:
        account = Account(data, strategies)
        outcome = run_command(capsys, argv, account, connect, (0,))
        if account.first_bad is not None:  # an endless or token-repeating listing: covered above
            return
        assert outcome.code == 0, outcome
        found = {record["TrainingJob"]["TrainingJobName"] for page in account.served_in_shape("search")
                 for record in page["Results"]}  # fmt: skip
        described = [call["TrainingJobName"] for name, call in account.calls if name == "describe_training_job"]
        assert found and found <= set(described) and len(described) == len(set(described)), (found, described)

    def connect(account: Account) -> None:
        monkeypatch.setattr(aws, "make_client", lambda region: account)

    run_many(runs, 12)
