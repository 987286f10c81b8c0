"""``btk report`` against generated SageMaker listings outside the documented shape.

Every list call the report makes (``ListPipelineExecutions``, ``ListPipelineExecutionSteps``,
``Search``) is answered from a generated script of pages: tokens that repeat (at once or in a
cycle), that are missing, null, empty, not text, or new on every page without end; item lists
that are missing, null, empty or not a list; pages that are not objects. ``btk report`` must

- finish (no hang: the stand-in counts its calls and fails the test past a bound),
- exit 0 with output when every listing it was served ends properly with pages of the documented
  shape,
- exit 2 with one line naming the call when any listing does not, or a page is outside the shape
  (a null member included; never a partial answer),
- never raise.

Generated cases per run: 300 report runs, each served up to 3 listings of up to 6 scripted pages
(an endless listing: up to 1,000 pages).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from cli_fixtures import ON_DEMAND_ENV, assert_one_line_error, btk, install
from example_budget import capped
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from btk.pagination import MAX_PAGES
from btk.report import aws

RESULT_KEYS = {
    "list_pipeline_executions": "PipelineExecutionSummaries",
    "list_pipeline_execution_steps": "PipelineExecutionSteps",
    "search": "Results",
}
#: Items each listing may hold: enough for the report to follow them (an execution's steps), none
#: naming a training job, so every call the report makes is a listing.
ITEMS = {
    "list_pipeline_executions": {
        "PipelineExecutionArn": "arn:aws:sagemaker:us-east-1:123456789012:pipeline/p/execution/e"
    },
    "list_pipeline_execution_steps": {"StepName": "Train", "Metadata": {}},
    "search": {"TrainingJob": {}},
}
ENDLESS = "endless"


@dataclass
class Listing:
    """One listing being served: which page comes next, the tokens given so far."""

    given: list[str] = field(default_factory=list)


@dataclass
class ScriptedSageMaker:
    """Answers each list call from its script; records whether it served anything a listing must not end with."""

    scripts: dict[str, Any]
    calls: int = 0
    served_bad: bool = False
    listings: dict[str, Listing] = field(default_factory=dict)

    def _page(self, operation: str, parameters: dict[str, Any]) -> Any:
        self.calls += 1
        assert self.calls <= 4 * MAX_PAGES + 100, "the report kept following pages"
        if "NextToken" not in parameters:
            self.listings[operation] = Listing()
        listing = self.listings[operation]
        if listing.given:
            assert parameters.get("NextToken") == listing.given[-1], "the reader asked for another page than given"
        script = self.scripts[operation]
        token: Any
        if script == ENDLESS:
            token = f"page-{len(listing.given) + 1}"
            page: Any = {RESULT_KEYS[operation]: [], "NextToken": token}
            self.served_bad |= len(listing.given) + 1 >= MAX_PAGES  # page MAX_PAGES still names a next one
        else:
            page = script[min(len(listing.given), len(script) - 1)]
            token = page.get("NextToken") if isinstance(page, dict) else None
            self.served_bad |= not self._well_formed(operation, page, listing)
        if isinstance(token, str) and token:
            listing.given.append(token)
        return page

    @staticmethod
    def _well_formed(operation: str, page: Any, listing: Listing) -> bool:
        """A page of the documented shape (a null is none: botocore's parser drops JSON nulls) that
        names no page already given."""
        if not isinstance(page, dict):
            return False
        key = RESULT_KEYS[operation]
        if key in page and not isinstance(page[key], list):
            return False
        if "NextToken" in page and not isinstance(page["NextToken"], str):
            return False
        token = page.get("NextToken", "")
        return token == "" or token not in listing.given

    def list_pipeline_executions(self, **parameters: Any) -> Any:
        return self._page("list_pipeline_executions", parameters)

    def list_pipeline_execution_steps(self, **parameters: Any) -> Any:
        return self._page("list_pipeline_execution_steps", parameters)

    def search(self, **parameters: Any) -> Any:
        return self._page("search", parameters)


TOKENS = st.one_of(st.none(), st.sampled_from(["", "a", "b", "c"]), st.integers(), st.just(["a"]))


def pages(operation: str) -> st.SearchStrategy[Any]:
    item = ITEMS[operation]
    items = st.one_of(st.none(), st.lists(st.just(item), max_size=2), st.just("garbage"), st.just({"a": 1}))
    page = st.fixed_dictionaries({}, optional={RESULT_KEYS[operation]: items, "NextToken": TOKENS})
    return st.one_of(
        st.just(ENDLESS),
        st.lists(st.one_of(page, page, page, st.none(), st.just([item])), min_size=1, max_size=6),
    )


SCRIPTS = st.fixed_dictionaries({operation: pages(operation) for operation in RESULT_KEYS})


@settings(max_examples=capped(300), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scripts=SCRIPTS)
def test_report_on_any_listing_ends_with_a_report_or_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, scripts: dict[str, Any]
) -> None:
    install(monkeypatch)
    sagemaker = ScriptedSageMaker(scripts)
    monkeypatch.setattr(aws, "make_client", lambda region: sagemaker)
    outcome = btk(capsys, ["report", "--env", ON_DEMAND_ENV.name, "--format", "json"])
    if sagemaker.served_bad:
        assert_one_line_error(outcome)
        assert outcome.err.startswith("btk: error: sagemaker:List") or outcome.err.startswith(
            "btk: error: sagemaker:Search"
        ), outcome
    else:
        assert outcome.code == 0 and outcome.out.strip() and "Traceback" not in outcome.err, outcome
