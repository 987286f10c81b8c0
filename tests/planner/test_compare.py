"""``btk compare``'s typed rows and their table: fits, does-not-fit, and the documented JSON row."""

from __future__ import annotations

import pytest
from fixture_catalog import PROFILES

from btk.hardware import get_instance_type
from btk.planner.compare import compare_instance, compare_instances
from btk.planner.render import render_compare
from btk.planner.search import plan_profile

FITTING_KEYS = [
    "instance_type",
    "fits",
    "knobs",
    "tokens_per_second_per_gpu",
    "tokens_per_second_per_node",
    "mfu",
    "usd_per_billion_tokens",
    "memory_gib",
    "training_cost",
    "longest_seq_len_one_node",
    "error_band",
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
        "fits": False,
        "reason": row.reason,
        "longest_seq_len_one_node": 0,
        "error_band": row.band.as_json(),
    }
    assert row.reason and "GiB" in row.reason


def test_the_table_keeps_every_row_in_line_when_one_does_not_fit() -> None:
    instances = [get_instance_type(name) for name in ("ml.p4de.24xlarge", "ml.p6-b200.48xlarge")]
    lines = render_compare("llama-65b", 1, compare_instances(PROFILES["llama-65b"], instances, 1)).splitlines()
    assert lines[0] == "llama-65b on 1 node(s) of each instance type"
    header, rule, missing, fitting = lines[2:6]
    assert set(rule) == {"-"} and len(rule) == len(header)
    assert missing.split() == ["ml.p4de.24xlarge", "does", "not", "fit", "does", "not", "fit"]
    column_end = header.index("tok/s/GPU") + len("tok/s/GPU")
    assert missing[:column_end].endswith("does not fit") and fitting[column_end - 1].isdigit()
    assert header.endswith("  knobs") and fitting.endswith("full_shard tp=1")
