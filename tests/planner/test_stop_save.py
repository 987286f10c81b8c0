"""The plan's stop save: what a SIGTERM's checkpoint writes per node and the rate it needs within SageMaker's grace."""

from __future__ import annotations

import json

import fixture_catalog as fc
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from btk.hardware import get_instance_type
from btk.planner.search import plan_profile
from btk.planner.stop_save import SAVE_EXIT_MARGIN_SECONDS, SIGTERM_GRACE_SECONDS, StopSave


def test_the_grace_is_sagemakers_and_the_trainer_reads_it_here() -> None:
    import btk_trainer.stopping as stopping

    assert SIGTERM_GRACE_SECONDS == 120.0  # StopTrainingJob, SageMaker API reference
    assert (stopping.SIGTERM_GRACE_SECONDS, stopping.SAVE_EXIT_MARGIN_SECONDS) == (120.0, SAVE_EXIT_MARGIN_SECONDS)


def test_an_eight_billion_model_on_one_node() -> None:
    save = StopSave(8_030_261_248, 1)
    assert save.gib_per_node == pytest.approx(8_030_261_248 * 12 / 2**30)  # 89.7 GiB
    assert save.needed_gib_per_second_per_node == pytest.approx(89.74 / 110, rel=1e-3)
    assert StopSave(8_030_261_248, 2).gib_per_node == pytest.approx(save.gib_per_node / 2)


@given(rate=st.floats(min_value=0.01, max_value=100), nodes=st.integers(min_value=1, max_value=64))
@example(rate=98.81821536323014, nodes=37)  # the closed form alone rounds one parameter past this rate
def test_the_largest_model_at_a_rate_just_fits(rate: float, nodes: int) -> None:
    largest = StopSave(1, nodes).largest_parameters(rate)
    assert StopSave(largest, nodes).needed_gib_per_second_per_node <= rate
    assert StopSave(largest + nodes * 2, nodes).needed_gib_per_second_per_node > rate


def test_the_plan_prints_and_reports_its_stop_save(capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from btk.cli import main

    fc.install(monkeypatch)
    profile = fc.LLAMA_8B
    plan = plan_profile(profile, get_instance_type("ml.p6-b200.48xlarge"), 2)
    assert plan.to_json()["stop_save"] == {
        "gib_per_node": round(profile.parameter_count * 12 / 2 / 2**30, 2), "seconds": 110.0,
        "needed_gib_per_second_per_node": round(profile.parameter_count * 12 / 2 / 2**30 / 110, 3)}
    assert main(["plan", profile.name, "--nodes", "2"]) == 0
    text = capsys.readouterr().out
    assert f"stop save: {plan.stop_save.gib_per_node:,.1f} GiB per node" in text
    assert main(["plan", profile.name, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["stop_save"]["seconds"] == 110.0
