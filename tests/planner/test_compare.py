"""``btk compare``'s typed rows and their table: fits, does-not-fit, and the documented JSON row."""

from __future__ import annotations

import pytest
from example_budget import capped
from fixture_catalog import PROFILES
from hypothesis import given, settings
from hypothesis import strategies as st

from btk.hardware import get_instance_type
from btk.planner.compare import CostRank, InstanceComparison, compare_instance, compare_instances, rank_by_cost
from btk.planner.render import render_compare
from btk.planner.search import plan_profile

FITTING_KEYS = [
    "instance_type",
    "gpu",
    "fits",
    "knobs",
    "tokens_per_second_per_gpu",
    "tokens_per_second_per_node",
    "mfu",
    "usd_per_billion_tokens",
    "memory_gib",
    "training_cost",
    "longest_seq_len_one_node",
    "cost_rank",
    "cost_rank_worst",
    "indistinguishable_from",
    "error_band",
    "evidence",
]


def test_a_fitting_row_carries_the_plan_rounded_as_documented() -> None:
    profile, instance = PROFILES["llama3.1-8b"], get_instance_type("ml.p6-b200.48xlarge")
    row = compare_instance(profile, instance, 1)
    plan = plan_profile(profile, instance, 1)
    assert row.fits and row.planned is not None and row.reason is None
    assert row.planned.knobs == plan.knobs
    document = row.to_json()
    assert list(document) == FITTING_KEYS
    assert document["knobs"] == plan.knobs.model_dump()
    assert document["tokens_per_second_per_gpu"] == round(plan.evaluation.estimate.tokens_per_second_per_gpu, 1)
    assert document["tokens_per_second_per_node"] == pytest.approx(
        plan.evaluation.estimate.tokens_per_second_per_gpu * instance.gpus_per_node, abs=0.05
    )
    assert document["memory_gib"] == round(plan.evaluation.memory.total, 1)
    cost = plan.training_cost()
    assert document["training_cost"] == (cost.as_json() if cost is not None else None)


@pytest.mark.parametrize("instance_name", ["ml.p5.48xlarge", "ml.p6-b200.48xlarge", "ml.p5en.48xlarge"])
def test_plan_and_compare_print_the_same_figures_the_same_way(instance_name: str) -> None:
    """One value, one formatting: the MFU and speed `btk plan` prints are the ones `btk compare` prints."""
    from btk.planner.render import format_mfu, format_speed, render_plan

    profile, instance = PROFILES["llama3.1-8b"], get_instance_type(instance_name)
    plan = plan_profile(profile, instance, 1)
    row = compare_instance(profile, instance, 1)
    assert row.planned is not None
    estimate = plan.evaluation.estimate
    assert format_mfu(row.planned.mfu) == format_mfu(estimate.mfu)
    plan_text = render_plan(plan)
    compare_text = render_compare(profile.name, 1, [row])
    for cell in (f"MFU {format_mfu(estimate.mfu)}", format_speed(estimate.tokens_per_second_per_gpu)):
        assert cell in plan_text
    assert f" {format_mfu(estimate.mfu)} " in compare_text
    assert format_speed(estimate.tokens_per_second_per_gpu) in compare_text


def test_a_row_that_does_not_fit_says_why() -> None:
    row = compare_instance(PROFILES["llama-65b"], get_instance_type("ml.p4de.24xlarge"), 1)
    assert not row.fits and row.planned is None
    assert row.to_json() == {
        "instance_type": "ml.p4de.24xlarge",
        "gpu": "NVIDIA A100 80GB",
        "fits": False,
        "reason": row.reason,
        "longest_seq_len_one_node": 0,
        "error_band": row.band.as_json(),
    }
    assert row.reason and "GiB" in row.reason


def test_the_table_keeps_every_row_in_line_when_one_does_not_fit() -> None:
    instances = [get_instance_type(name) for name in ("ml.p4de.24xlarge", "ml.p6-b200.48xlarge")]
    lines = render_compare("llama-65b", 1, compare_instances(PROFILES["llama-65b"], instances, 1)).splitlines()
    assert lines[0] == "llama-65b on 1 node(s) of each instance type, cheapest first"
    header, rule, fitting, missing = lines[2:6]  # the row that fits first: rows are sorted by cost
    assert set(rule) == {"-"} and len(rule) == len(header)
    assert missing.split() == ["-", "ml.p4de.24xlarge", "NVIDIA", "A100", "80GB", "does", "not", "fit", "does", "not",
                               "fit"]
    column_end = header.index("tok/s/GPU") + len("tok/s/GPU")
    assert missing[:column_end].endswith("does not fit") and fitting[column_end - 1].isdigit()
    assert header.endswith("  knobs") and fitting.endswith("full_shard tp=1")
    assert fitting.split()[:3] == ["1", "ml.p6-b200.48xlarge", "NVIDIA"]


# ------------------------------------------------------------------------------ ranking by cost


def _row(name: str, usd_per_billion: float, band: float | None) -> InstanceComparison:
    """A fitting row costing ``usd_per_billion`` with a tokens/s band of ``band`` (None: outside the evidence)."""
    from btk.knobs import TrainingKnobs
    from btk.planner.band import ErrorBand
    from btk.planner.compare import PlannedFigures

    figures = PlannedFigures(TrainingKnobs(micro_batch_size=1, seq_len=8192), 1.0, 8.0, 0.5, usd_per_billion, 1.0, None)
    error_band = ErrorBand("family", None if band is None else "family / any / any / any", band, None,
                           0 if band is None else 3, 0, (), () if band is not None else ("outside the evidence",))
    return InstanceComparison(name, "GPU " + name, 0, figures, error_band)


def test_rows_are_sorted_by_cost_and_differences_inside_the_band_are_indistinguishable() -> None:
    rows = [_row("c", 130.0, 0.10), _row("a", 100.0, 0.10), _row("b", 108.0, 0.05), _row("d", 200.0, 0.10)]
    ranked = rank_by_cost(rows)
    assert [row.instance_type for row in ranked] == ["a", "b", "c", "d"]
    standing = {row.instance_type: row.cost_rank for row in ranked}
    # b is 8 % dearer than a, inside the wider band (10 %); c is 30 % dearer than a but 20.4 % dearer than b
    assert standing["a"] == CostRank(1, ("b",)) and standing["a"].label() == "1-2"
    assert standing["b"] == CostRank(1, ("a",))
    assert standing["c"] == CostRank(3, ())
    assert standing["d"] == CostRank(4, ())


def test_a_row_outside_the_evidence_is_not_ranked_and_misfits_come_last() -> None:
    misfit = InstanceComparison("m", "GPU m", 0, None, _row("x", 1.0, 0.1).band, "does not fit")
    ranked = rank_by_cost([misfit, _row("u", 50.0, None), _row("a", 100.0, 0.1)])
    assert [(row.instance_type, row.cost_rank) for row in ranked] == [("a", CostRank(1, ())), ("u", None), ("m", None)]
    text = render_compare("p", 1, ranked)
    table = {line.split()[1]: line.split()[0] for line in text.splitlines()[4:7]}
    assert table == {"a": "1", "u": "?", "m": "-"}


def test_indistinguishable_rows_are_named_in_the_text() -> None:
    text = render_compare("p", 1, rank_by_cost([_row("a", 100.0, 0.1), _row("b", 105.0, 0.1)]))
    assert "a $100 per billion tokens is indistinguishable from b $105" in text
    assert [line.split()[0] for line in text.splitlines()[4:6]] == ["1-2", "1-2"]


def _ranges(text: str) -> dict[str, tuple[int, int]]:
    """The rank column of a compare table: instance type -> (best, worst) place."""
    ranges = {}
    for line in text.splitlines()[4:]:
        if not line.strip():
            break
        label, name = line.split()[:2]
        best, _, worst = label.partition("-")
        ranges[name] = (int(best), int(worst or best))
    return ranges


def _named_pairs(text: str) -> set[frozenset[str]]:
    """The pairs the notes under the table call indistinguishable."""
    pairs = set()
    names = set(_ranges(text))
    for line in text.splitlines():
        if " is indistinguishable from " in line and line.split()[0] in names:
            head, _, tail = line.partition(" is indistinguishable from ")
            pairs |= {frozenset((head.split()[0], other.split()[0])) for other in tail.split(", ")}
    return pairs


def test_a_wide_band_row_and_the_rows_its_band_covers_share_places() -> None:
    """The case a user met: a wide-band row indistinguishable from a far costlier one, two narrow rows between.

    Labels that named ranks (=1, =3) contradicted the note that rows 1 and 4 cannot be told apart;
    the ranges say it: row 1 can take any place, row 4 place 3 or 4.
    """
    rows = [_row("b200", 199.0, 1.037), _row("p5", 213.0, 0.261), _row("p5en", 214.0, 0.261),
            _row("p4de", 279.0, 0.076)]
    text = render_compare("p", 1, rank_by_cost(rows))
    assert _ranges(text) == {"b200": (1, 4), "p5": (1, 3), "p5en": (1, 3), "p4de": (3, 4)}
    assert frozenset(("b200", "p4de")) in _named_pairs(text)


@settings(max_examples=capped(150), deadline=None)
@given(st.lists(st.tuples(st.floats(50.0, 500.0), st.sampled_from([0.02, 0.05, 0.1, 0.3, 1.0])),
                min_size=1, max_size=6))
def test_the_rank_labels_and_the_indistinguishable_notes_agree(costs: list[tuple[float, float]]) -> None:
    """For any costs and bands: rows named indistinguishable have overlapping places, a certain place (one
    number) belongs to a row indistinguishable from none."""
    ranked = rank_by_cost([_row(f"i{n}", round(cost), band) for n, (cost, band) in enumerate(costs)])
    text = render_compare("p", 1, ranked)
    ranges, pairs = _ranges(text), _named_pairs(text)
    assert sorted(ranges) == sorted(row.instance_type for row in ranked)
    for pair in pairs:
        (a_best, a_worst), (b_best, b_worst) = (ranges[name] for name in pair)
        assert a_best <= b_worst and b_best <= a_worst, (pair, ranges)
    for name, (best, worst) in ranges.items():
        assert 1 <= best <= worst <= len(ranges)
        assert (best == worst) == (not any(name in pair for pair in pairs)), (name, ranges, pairs)


def test_total_tokens_replaces_the_profiles_in_the_cost() -> None:
    profile, instance = PROFILES["llama3.1-8b"], get_instance_type("ml.p5.48xlarge")
    default, = compare_instances(profile, [instance], 1)
    doubled, = compare_instances(profile, [instance], 1, total_tokens=2 * (profile.training.total_tokens or 1))
    assert default.planned is not None and doubled.planned is not None
    assert default.planned.training_cost is not None and doubled.planned.training_cost is not None
    assert doubled.planned.training_cost.on_demand_usd == pytest.approx(2 * default.planned.training_cost.on_demand_usd)
