"""``btk evidence import|list|export`` and ``btk plan --evidence``: the team's runs in, the plan corrected."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import fixture_catalog
import pytest
from cli_run import run
from evidence_documents import B200, runs_document
from example_budget import capped
from fixture_catalog import PROFILES
from hypothesis import given, settings
from hypothesis import strategies as st

from btk.planner.evidence import WITHIN_SETUP_SCATTER, Z


@pytest.fixture(autouse=True)
def _fixture_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fixture catalog's profiles, whatever the user's profiles/ holds."""
    fixture_catalog.install(monkeypatch)


def _runs(*speeds: float, profile: str = "llama3.1-8b") -> dict[str, Any]:
    return runs_document(*speeds, profile=profile)


def _write(path: Path, document: Any) -> Path:
    path.write_text(json.dumps(document))
    return path


def test_import_list_export_and_the_plan_corrected(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    store = tmp_path / "evidence.json"
    code, out, _ = run(capsys, "evidence", "import", str(_write(tmp_path / "a.json", _runs(15000.0, 15600.0))),
                       "--evidence", str(store))
    assert code == 0 and "2 run(s) added, 0 replaced, 2 in all" in out
    code, out, _ = run(capsys, "evidence", "import", str(_write(tmp_path / "b.json", _runs(15300.0))),
                       "--evidence", str(store))  # the same id as the first: replaced
    assert code == 0 and "0 run(s) added, 1 replaced, 2 in all" in out
    code, out, _ = run(capsys, "evidence", "list", "--evidence", str(store), "--format", "json")
    rows = json.loads(out)
    assert [row["tokens_per_second_per_gpu"] for row in rows] == [15300.0, 15600.0]
    assert all(row["measured_over_predicted"] == pytest.approx(
        row["tokens_per_second_per_gpu"] / row["predicted_tokens_per_second_per_gpu"], rel=1e-3) for row in rows)

    code, out, _ = run(capsys, "plan", "llama3.1-8b", "--evidence", str(store), "--format", "json")
    plan = json.loads(out)
    evidence = plan["evidence"]
    assert evidence["runs"] == [row["id"] for row in rows] and 0.7 < evidence["factor"] < 0.85
    assert evidence["tokens_per_second_per_gpu"] == pytest.approx(
        plan["estimate"]["tokens_per_second_per_gpu"] * evidence["factor"], rel=1e-3)
    # The published band adds to what the two runs say: the band is narrower than theirs alone would be.
    runs_alone = math.expm1(Z * WITHIN_SETUP_SCATTER * math.sqrt(1 + 1 / 2))
    assert evidence["tokens_per_second_relative"] < runs_alone
    code, out, _ = run(capsys, "plan", "llama3.2-3b", "--evidence", str(store), "--format", "json")
    assert json.loads(out)["evidence"] is None  # another model: its runs say nothing
    code, out, _ = run(capsys, "plan", "llama3.1-8b", "--evidence", str(store))
    assert "team's evidence: 2 measured run(s) of this model on this instance type" in out
    assert f"at the team's measured speed (x{evidence['factor']:.3f})" in out  # what the long run costs at it

    code, out, _ = run(capsys, "evidence", "export", str(tmp_path / "out.json"), "--evidence", str(store))
    assert code == 0 and json.loads((tmp_path / "out.json").read_text()) == json.loads(store.read_text())
    code, _, err = run(capsys, "evidence", "export", str(tmp_path / "out.json"), "--evidence", str(store))
    assert code == 2 and "exists" in err


@pytest.mark.parametrize(("document", "phrase"), [
    ({"version": 2, "runs": []}, "version 2 is not supported"),
    ({"runs": [{"id": "x"}]}, "runs.0.kind: Field required"),
    ("not an object", "Input should be"),
])
def test_a_file_that_is_not_evidence_is_one_line_and_the_store_is_untouched(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, document: Any, phrase: str) -> None:
    store = _write(tmp_path / "evidence.json", _runs(15000.0))
    before = store.read_text()
    good = _write(tmp_path / "good.json", _runs(16000.0, profile="llama3.2-3b"))
    code, _, err = run(capsys, "evidence", "import", str(good), str(_write(tmp_path / "bad.json", document)),
                       "--evidence", str(store))
    assert code == 2 and phrase in err and "bad.json" in err and len(err.strip().splitlines()) == 1
    assert store.read_text() == before  # the good file was not merged either


def test_a_duplicate_id_in_one_file_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    document = _runs(15000.0)
    document["runs"].append(document["runs"][0])
    code, _, err = run(capsys, "evidence", "import", str(_write(tmp_path / "dup.json", document)),
                       "--evidence", str(tmp_path / "store.json"))
    assert code == 2 and "appears twice" in err and not (tmp_path / "store.json").exists()


@settings(max_examples=capped(40), deadline=None)
@given(document=st.recursive(st.none() | st.booleans() | st.floats(allow_nan=True) | st.text(max_size=8),
                             lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                         max_size=3), max_leaves=12))
def test_any_json_is_evidence_or_one_line(document: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    from btk.errors import BtkError
    from btk.evidence import read_evidence

    path = tmp_path_factory.mktemp("e") / "any.json"
    path.write_text(json.dumps(document))
    try:
        read_evidence(path)
    except BtkError as error:
        assert "\n" not in str(error) and str(path) in str(error)


def test_a_store_below_a_file_is_one_line_not_an_empty_store(capsys: pytest.CaptureFixture[str],
                                                             tmp_path: Path) -> None:
    (tmp_path / "file.json").write_text("{}")
    for command in (["evidence", "list"], ["plan", "llama3.1-8b"]):
        code, _, err = run(capsys, *command, "--evidence", str(tmp_path / "file.json" / "store.json"))
        assert code == 2 and "file.json is a file, not a folder" in err and len(err.strip().splitlines()) == 1


def test_a_plan_that_buys_capacity_says_whether_its_model_was_rehearsed(capsys: pytest.CaptureFixture[str],
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    """An environment that buys its training plan at deploy: each plan says whether a measured run of its model on
    the instance type is on record (a rehearsal, or a completed run); elsewhere nothing is said."""
    from datetime import UTC, datetime

    from btk.environment import ReservePlanCapacity

    reserve = fixture_catalog.STAGING.model_copy(update={
        "name": "buying", "profiles": ("llama3.1-8b", "llama3.2-3b"), "instance_count": 1,
        "capacity": ReservePlanCapacity(start_after=datetime(2027, 1, 4, tzinfo=UTC), duration_hours=168,
                                        instance_count=1, max_upfront_fee=50_000, purchase_approved=True)})
    fixture_catalog.install(monkeypatch, reserve)
    runs = _runs(15000.0)
    runs["runs"].append({**runs["runs"][0], "id": "btk-prod-llama3.2-3b-run", "kind": "run", "profile": "llama3.2-3b",
                         "architecture": PROFILES["llama3.2-3b"].architecture.model_dump(mode="json"),
                         "instance_type": "ml.p5.48xlarge"})  # another instance type: not this one's
    store = _write(tmp_path / "evidence.json", runs)
    code, out, _ = run(capsys, "plan", "--env", "buying", "--evidence", str(store), "--format", "json")
    assert code == 0
    assert [plan["runs_on_record"] for plan in json.loads(out)] == [["btk-prod-llama3.1-8b-reh-0"], []]
    code, out, _ = run(capsys, "plan", "--env", "buying", "--evidence", str(store))
    assert f"rehearsed: 1 measured run(s) of this model on {B200} on record in {store} (btk-prod-llama3.1-8b-reh-0)" \
        in out
    assert f"not rehearsed: no run of this model on {B200} on record in {store}; before buying capacity" in out
    code, out, _ = run(capsys, "plan", "--env", fixture_catalog.STAGING.name, "--evidence", str(store),
                       "--format", "json")
    assert all(plan["runs_on_record"] is None for plan in json.loads(out))


def test_estimate_and_compare_are_corrected_where_the_team_measured(capsys: pytest.CaptureFixture[str],
                                                                    tmp_path: Path) -> None:
    """The what-if and the comparison use the team's runs too: the row of the instance type they ran on gets the
    corrected speed, costs and band (and its rank follows), the others stay the planner's."""
    store = _write(tmp_path / "evidence.json", _runs(9000.0, 9300.0))  # far below the planner's B200 figure
    code, out, _ = run(capsys, "estimate", "llama3.1-8b", "--format", "json")
    plain = json.loads(out)
    assert code == 0 and plain["evidence"] is None
    code, out, _ = run(capsys, "estimate", "llama3.1-8b", "--evidence", str(store), "--format", "json")
    corrected = json.loads(out)["evidence"]
    predicted = plain["estimate"]["tokens_per_second_per_gpu"]
    assert corrected["runs"] == ["btk-prod-llama3.1-8b-reh-0", "btk-prod-llama3.1-8b-reh-1"]
    assert 9000.0 < corrected["tokens_per_second_per_gpu"] < predicted and corrected["factor"] < 1
    code, out, _ = run(capsys, "estimate", "llama3.1-8b", "--evidence", str(store))
    assert code == 0 and "team's evidence: 2 measured run(s) of this model on this instance type" in out
    assert "per billion tokens at that speed" in out

    instances = "ml.p5.48xlarge,ml.p6-b200.48xlarge"
    code, out, _ = run(capsys, "compare", "llama3.1-8b", "--instances", instances, "--format", "json")
    before = {row["instance_type"]: row for row in json.loads(out)["instances"]}
    code, out, _ = run(capsys, "compare", "llama3.1-8b", "--instances", instances, "--evidence", str(store),
                       "--format", "json")
    after = {row["instance_type"]: row for row in json.loads(out)["instances"]}
    ranking = ("cost_rank", "cost_rank_worst", "indistinguishable_from")  # may move with the B200 row
    assert after["ml.p5.48xlarge"] == before["ml.p5.48xlarge"] | {key: after["ml.p5.48xlarge"][key] for key in ranking}
    b200, factor = after[B200], after[B200]["evidence"]["factor"]
    # (the JSON's factor is rounded to 4 digits)
    assert b200["tokens_per_second_per_gpu"] == pytest.approx(before[B200]["tokens_per_second_per_gpu"] * factor,
                                                              rel=1e-3)
    assert b200["usd_per_billion_tokens"] == pytest.approx(before[B200]["usd_per_billion_tokens"] / factor, rel=1e-3)
    assert b200["training_cost"]["on_demand"]["usd"] == pytest.approx(
        before[B200]["training_cost"]["on_demand"]["usd"] / factor, rel=1e-3)
    code, out, _ = run(capsys, "compare", "llama3.1-8b", "--instances", instances, "--evidence", str(store))
    assert f"corrected by the team's measured runs (speed, MFU and costs): {B200}" in out
    assert f"  {B200:22} team's evidence: 2 measured run(s)" in out


@pytest.mark.parametrize("flag", [True, "true", "TRUE"])
def test_a_deploy_that_buys_refuses_unrehearsed_profiles_with_the_flag(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, flag: Any) -> None:
    """``-c require_rehearsal=true``: an environment that buys its training plan at deploy synthesizes only once
    each profile's model has a measured run on the instance type in the evidence store; one line naming every
    profile without one. Without the flag, or where nothing is bought, nothing is checked."""
    from datetime import UTC, datetime

    from app import refuse_an_unrehearsed_purchase
    from btk.environment import ReservePlanCapacity
    from btk.errors import BtkError

    reserve = fixture_catalog.STAGING.model_copy(update={
        "name": "buying", "profiles": ("llama3.1-8b", "llama3.2-3b"), "instance_count": 1,
        "instance_type": B200,
        "capacity": ReservePlanCapacity(start_after=datetime(2027, 1, 4, tzinfo=UTC), duration_hours=168,
                                        instance_count=1, max_upfront_fee=50_000, purchase_approved=True)})
    store = tmp_path / "evidence.json"
    monkeypatch.setenv("BTK_EVIDENCE", str(store))
    with pytest.raises(BtkError) as refused:
        refuse_an_unrehearsed_purchase(reserve, {"require_rehearsal": flag})
    assert str(refused.value) == (
        f"-c require_rehearsal=true: environment buying buys a training plan at deploy, and llama3.1-8b, llama3.2-3b "
        f"have no measured run on {B200} in {store}: rehearse on demand first (btk rehearse PROFILE --env ENV), or "
        "bring the team's runs (btk evidence pull --env buying)")
    _write(store, _runs(15000.0))
    with pytest.raises(BtkError, match=r"and llama3\.2-3b has no measured run"):
        refuse_an_unrehearsed_purchase(reserve, {"require_rehearsal": flag})
    both = _runs(15000.0)
    both["runs"] += runs_document(9000.0, profile="llama3.2-3b")["runs"]
    _write(store, both)
    refuse_an_unrehearsed_purchase(reserve, {"require_rehearsal": flag})  # every profile rehearsed: synthesizes
    _write(store, {"version": 1, "runs": []})
    refuse_an_unrehearsed_purchase(reserve, {})  # no flag
    refuse_an_unrehearsed_purchase(reserve, {"require_rehearsal": "false"})
    refuse_an_unrehearsed_purchase(fixture_catalog.STAGING, {"require_rehearsal": flag})  # buys nothing at deploy
