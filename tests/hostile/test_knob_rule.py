"""One rule for precision x tensor parallelism, refused in one line wherever knobs enter."""

from __future__ import annotations

import pytest

from btk.catalog import all_profiles
from btk.cli import main
from btk.errors import InfeasiblePlanError
from btk.hardware import get_instance_type
from btk.planner.search import plan_profile
from btk.profile import KnobPins

INSTANCE = "ml.p6-b200.48xlarge"


def _profile_with_heads_for(tp: int) -> str:
    return next(name for name, p in sorted(all_profiles().items()) if p.architecture.num_kv_heads % tp == 0)


@pytest.mark.parametrize("precision", ["mxfp8", "fp8_rowwise"])
def test_estimate_refuses_the_pair_with_exit_2_naming_both_knobs(
    precision: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["estimate", _profile_with_heads_for(2), "--instance", INSTANCE,
            "--set", f"precision={precision}", "--set", "tensor_parallel=2"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"precision {precision} with tensor_parallel 2" in err


@pytest.mark.parametrize("precision", ["mxfp8", "fp8_rowwise"])
def test_a_profile_pinning_the_pair_fails_planning_in_one_line(precision: str) -> None:
    base = all_profiles()[_profile_with_heads_for(2)]
    pinned = base.model_copy(update={"pinned": KnobPins(precision=precision, tensor_parallel=2)})
    with pytest.raises(InfeasiblePlanError, match=f"pinned precision {precision} with tensor_parallel 2"):
        plan_profile(pinned, get_instance_type(INSTANCE))


def test_the_search_never_proposes_the_pair() -> None:
    profile = all_profiles()[_profile_with_heads_for(2)]
    plan = plan_profile(profile, get_instance_type(INSTANCE))
    for evaluation in plan.candidates:
        knobs = evaluation.knobs
        assert knobs.tensor_parallel == 1 or knobs.precision in ("bf16", "fp8_tensorwise")
