"""The planner: feasibility, pins, monotonicity, the B200 thesis, and error messages."""

from __future__ import annotations

import dataclasses

import pytest
from example_budget import capped
from fixture_catalog import PROFILES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from btk.catalog import all_profiles, get_profile
from btk.errors import InfeasiblePlanError
from btk.hardware import INSTANCE_TYPES, Fact, InstanceType, get_instance_type
from btk.knobs import TrainingKnobs
from btk.planner.search import (
    EXPLAINED_KNOBS,
    SPEED_RESOLUTION,
    Evaluation,
    choose_best,
    evaluate_knobs,
    memory_budget_gib,
    plan_profile,
    rank,
)
from btk.profile import KnobPins

B200 = get_instance_type("ml.p6-b200.48xlarge")
SMALL_PROFILES = ("llama3.2-1b", "llama3.2-3b", "llama3.1-8b")


@pytest.mark.parametrize("name", sorted(all_profiles()))
def test_every_profile_plans_on_one_b200_node_or_explains(name: str) -> None:
    profile = get_profile(name)
    try:
        plan = plan_profile(profile, B200, 1)
    except InfeasiblePlanError as error:
        message = str(error)
        assert "GiB" in message and "budget" in message and "\n" not in message
        return
    assert plan.evaluation.fits
    assert plan.evaluation.memory.total <= plan.evaluation.budget_gib
    # One line per knob; context parallelism only where the plan shares its sequences (or the profile pins it).
    shares = plan.knobs.context_parallel > 1 or profile.pinned.context_parallel is not None
    assert len(plan.explanations) == len(EXPLAINED_KNOBS) - (not shares)


@pytest.mark.parametrize("name", SMALL_PROFILES)
def test_small_models_on_b200_turn_checkpointing_off_and_beat_baseline(name: str) -> None:
    plan = plan_profile(PROFILES[name], B200, 1)
    assert plan.knobs.activation_checkpointing == "none"
    assert plan.baseline is not None
    assert plan.baseline.knobs.activation_checkpointing == "full"
    assert plan.baseline.knobs.micro_batch_size == 1 and plan.baseline.knobs.precision == "bf16"
    assert plan.speedup_vs_baseline is not None and plan.speedup_vs_baseline > 1.2
    assert plan.explanations[0].startswith("activation checkpointing off: fits with")


def test_plans_are_deterministic() -> None:
    profile = PROFILES["qwen2.5-14b"]
    assert plan_profile(profile, B200, 2).to_json() == plan_profile(profile, B200, 2).to_json()


def test_plan_json_has_documented_shape() -> None:
    data = plan_profile(PROFILES["llama3.1-8b"], B200, 1).to_json()
    assert {
        "profile",
        "instance_type",
        "nodes",
        "knobs",
        "memory_gib",
        "estimate",
        "baseline",
        "speedup_vs_baseline",
    } <= set(data)
    assert set(data["memory_gib"]) == {
        "parameters",
        "gradients",
        "optimizer",
        "activations",
        "logits",
        "other",
        "total",
        "capacity",
    }
    assert {"tokens_per_second_per_gpu", "mfu", "step_seconds", "usd_per_billion_tokens"} <= set(data["estimate"])
    assert set(data["knobs"]) >= {
        "micro_batch_size",
        "gradient_accumulation_steps",
        "seq_len",
        "precision",
        "activation_checkpointing",
        "sharding",
        "tensor_parallel",
        "compile",
    }
    assert data["baseline"]["knobs"]["activation_checkpointing"] == "full"


def test_mxfp8_is_rejected_on_hopper_with_one_line() -> None:
    profile = PROFILES["llama3.1-8b"].model_copy(update={"pinned": KnobPins(precision="mxfp8")})
    with pytest.raises(InfeasiblePlanError, match=r"precision mxfp8 is not supported on ml.p5.48xlarge"):
        plan_profile(profile, get_instance_type("ml.p5.48xlarge"), 1)


def test_infeasible_pin_names_what_overflows_and_by_how_much() -> None:
    profile = PROFILES["qwen2.5-32b"].model_copy(
        update={"pinned": KnobPins(activation_checkpointing="none", micro_batch_size=4, tensor_parallel=1)}
    )
    with pytest.raises(InfeasiblePlanError) as error:
        plan_profile(profile, get_instance_type("ml.p5.48xlarge"), 1)
    message = str(error.value)
    assert "pinned" in message and "activation_checkpointing=none" in message
    assert "GiB over the" in message and "activations" in message


def _with_hbm(instance: InstanceType, hbm: float) -> InstanceType:
    gpu = dataclasses.replace(instance.gpu, hbm_gib=Fact(hbm, "test", "test"))
    return dataclasses.replace(instance, gpu=gpu)


pins_strategy = st.builds(
    KnobPins,
    micro_batch_size=st.none() | st.sampled_from([1, 2, 4]),
    precision=st.none() | st.sampled_from(["bf16", "fp8_tensorwise"]),
    activation_checkpointing=st.none() | st.sampled_from(["none", "selective", "full"]),
    sharding=st.none() | st.sampled_from(["full_shard", "no_shard"]),
    tensor_parallel=st.none() | st.sampled_from([1, 2]),
)


@settings(max_examples=capped(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(["llama3.2-1b", "llama3.2-3b", "llama3.1-8b", "qwen2.5-14b"]),
    instance_name=st.sampled_from(sorted(INSTANCE_TYPES)),
    nodes=st.sampled_from([1, 2]),
    pins=pins_strategy,
)
def test_plans_respect_budget_and_pins(name: str, instance_name: str, nodes: int, pins: KnobPins) -> None:
    profile = PROFILES[name].model_copy(update={"pinned": pins})
    instance = get_instance_type(instance_name)
    try:
        plan = plan_profile(profile, instance, nodes)
    except InfeasiblePlanError:
        return
    assert plan.evaluation.memory.total <= 0.9 * instance.hbm_gib + 1e-9
    for key, value in pins.as_dict().items():
        assert getattr(plan.knobs, key) == value, key
    for alternative in plan.alternatives:
        assert alternative.fits


@settings(max_examples=capped(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(["llama3.2-1b", "llama3.1-8b", "qwen2.5-14b", "qwen2.5-32b"]),
    low=st.floats(40, 200),
    extra=st.floats(0.5, 100),
)
def test_more_hbm_never_yields_a_slower_best_plan(name: str, low: float, extra: float) -> None:
    profile = PROFILES[name]
    small, large = _with_hbm(B200, low), _with_hbm(B200, low + extra)
    try:
        small_plan = plan_profile(profile, small, 1)
    except InfeasiblePlanError:
        return
    large_plan = plan_profile(profile, large, 1)  # must not raise: the small one fitted
    small_speed = small_plan.evaluation.estimate.tokens_per_second_per_gpu
    large_speed = large_plan.evaluation.estimate.tokens_per_second_per_gpu
    # the best of the larger GPU is tied with a fastest at least as fast as the smaller GPU's best
    assert large_speed >= small_speed * (1 - SPEED_RESOLUTION)


def test_evaluate_reports_overflow_without_raising() -> None:
    knobs = TrainingKnobs(micro_batch_size=8, seq_len=8192, activation_checkpointing="none")
    evaluation = evaluate_knobs(PROFILES["qwen2.5-32b"], get_instance_type("ml.p5.48xlarge"), 1, knobs)
    assert not evaluation.fits and evaluation.memory.total > evaluation.budget_gib


def test_hybrid_shard_needs_two_nodes() -> None:
    knobs = TrainingKnobs(micro_batch_size=1, seq_len=8192, sharding="hybrid_shard")
    with pytest.raises(InfeasiblePlanError, match="hybrid_shard needs at least 2 nodes"):
        evaluate_knobs(PROFILES["llama3.1-8b"], B200, 1, knobs)


def test_hybrid_shard_beats_full_shard_across_nodes_for_small_batches() -> None:
    profile = PROFILES["llama3.1-8b"]
    base = dict(micro_batch_size=1, seq_len=8192, gradient_accumulation_steps=1, activation_checkpointing="none")
    full = evaluate_knobs(profile, B200, 4, TrainingKnobs(**base, sharding="full_shard"))  # type: ignore[arg-type]
    hybrid = evaluate_knobs(profile, B200, 4, TrainingKnobs(**base, sharding="hybrid_shard"))  # type: ignore[arg-type]
    assert hybrid.estimate.tokens_per_second_per_gpu > full.estimate.tokens_per_second_per_gpu
    assert hybrid.memory.parameters > full.memory.parameters


def _with_speed_and_memory(evaluation: Evaluation, speed: float, memory: float) -> Evaluation:
    estimate = dataclasses.replace(evaluation.estimate, tokens_per_second_per_gpu=speed)
    return dataclasses.replace(
        evaluation, estimate=estimate, memory=dataclasses.replace(evaluation.memory, total=memory)
    )


def _constructed(*speed_and_memory: tuple[float, float]) -> list[Evaluation]:
    base = evaluate_knobs(PROFILES["llama3.2-1b"], B200, 1, TrainingKnobs(micro_batch_size=1, seq_len=8192))
    return [_with_speed_and_memory(base, speed, memory) for speed, memory in speed_and_memory]


def test_speeds_within_the_resolution_of_the_fastest_tie_and_less_memory_wins() -> None:
    # 0.2 % slower and 8 GiB less: tied (the old log-scale buckets split 10,000 and 9,980 apart)
    fastest, close, slow = _constructed((10_000, 60), (9_980, 52), (9_850, 10))
    assert choose_best([fastest, close, slow]) is close
    assert choose_best([close, fastest]) is close
    # exactly at the edge of the resolution still ties; beyond it does not, however little memory it needs
    edge = _constructed((10_000 * (1 - SPEED_RESOLUTION), 40))[0]
    assert choose_best([fastest, edge, slow]) is edge


def test_equal_speed_and_memory_keep_the_fixed_candidate_order() -> None:
    first, second = _constructed((10_000, 50), (10_000, 50))
    assert choose_best([first, second]) is first and choose_best([second, first]) is second
    assert rank([first, second], 2) == [first, second]


def test_the_plan_is_the_documented_choice_among_its_feasible_candidates() -> None:
    plan = plan_profile(PROFILES["llama3.1-8b"], get_instance_type("ml.p5.48xlarge"), 1)
    feasible = [candidate for candidate in plan.candidates if candidate.fits]
    fastest = max(candidate.estimate.tokens_per_second_per_gpu for candidate in feasible)
    tied = [c for c in feasible if c.estimate.tokens_per_second_per_gpu >= fastest * (1 - SPEED_RESOLUTION)]
    assert plan.evaluation.memory.total == min(c.memory.total for c in tied)
    assert plan.evaluation in tied


def test_why_lines_never_call_a_knob_set_that_does_not_fit_slower() -> None:
    """Where the faster rivals of a knob value overflow memory, the line names a fitting rival or the overflow."""
    from btk.planner.search import explain

    profile, instance = PROFILES["llama3.1-8b"], get_instance_type("ml.p5.48xlarge")
    plan = plan_profile(profile, instance, 1)
    candidates = list(plan.candidates)
    best = plan.evaluation
    # make every knob set with another micro-batch not fit, whatever its speed
    crippled = [c if c.knobs.micro_batch_size == best.knobs.micro_batch_size else dataclasses.replace(c, budget_gib=0.0)
                for c in candidates]
    line = next(line for line in explain(best, crippled, {}) if line.startswith("micro_batch_size"))
    assert "slower" not in line and "overflows memory" in line
    for candidates_used in (candidates, crippled):
        for text in explain(best, candidates_used, {}):
            if " slower " in text:
                rival_speed = float(text.split("(")[-1].split(" vs ")[0].replace(",", ""))
                assert any(c.fits and round(c.estimate.tokens_per_second_per_gpu) == rival_speed
                           for c in candidates_used), text


def test_the_knob_ladder_steps_down_in_memory_and_keeps_what_is_trained() -> None:
    """Every shipped profile on the default instance: each rung fits, trains the plan's global batch, sequence,
    precision, tensor parallelism, compile and loss, needs at most 90 % of the memory of the rung above, and is the
    fastest such candidate."""
    from btk.planner.search import LADDER_KEPT, LADDER_MEMORY_STEP, LADDER_RUNGS, knob_ladder

    for profile in PROFILES.values():
        plan = plan_profile(profile, B200)
        assert plan.ladder == knob_ladder(plan.evaluation, plan.candidates) and len(plan.ladder) <= LADDER_RUNGS
        above = plan.evaluation
        for rung in plan.ladder:
            assert rung.fits and rung.estimate.global_batch_tokens == plan.evaluation.estimate.global_batch_tokens
            assert all(getattr(rung.knobs, name) == getattr(plan.knobs, name) for name in LADDER_KEPT)
            assert rung.memory.total <= above.memory.total * LADDER_MEMORY_STEP
            leaner = [c for c in plan.candidates if c.fits and c.memory.total <= above.memory.total * LADDER_MEMORY_STEP
                      and c.estimate.global_batch_tokens == rung.estimate.global_batch_tokens
                      and all(getattr(c.knobs, name) == getattr(plan.knobs, name) for name in LADDER_KEPT)]
            assert rung.estimate.tokens_per_second_per_gpu == max(c.estimate.tokens_per_second_per_gpu for c in leaner)
            above = rung
        assert plan.to_json()["knob_ladder"] == [rung.as_json() for rung in plan.ladder]


def test_a_rehearsal_is_priced_and_gated_from_the_planners_figure_for_where_it_runs() -> None:
    from btk.planner.render import render_plan
    from btk.planner.search import rehearsal_gate, rehearsal_nodes

    for name, nodes in (("llama3.1-8b", 1), ("llama3.1-8b", 4), ("qwen2.5-32b", 2)):
        plan = plan_profile(PROFILES[name], B200, nodes)
        gate = rehearsal_gate(plan, 40, 0.7)
        where, evaluation = rehearsal_nodes(plan.profile, B200, nodes, plan.knobs)
        assert gate.nodes == where and (where == 1 or where == nodes)
        assert gate.predicted_tokens_per_second_per_gpu == evaluation.estimate.tokens_per_second_per_gpu
        assert gate.min_tokens_per_second_per_gpu == round(0.7 * gate.predicted_tokens_per_second_per_gpu, 1)
        assert gate.training_seconds == pytest.approx(40 * evaluation.estimate.step_seconds)
        assert gate.usd == pytest.approx(gate.training_seconds / 3600 * where * B200.usd_per_hour.value)
        # The memory limit is the budget every plan is made to fit: the plan's own prediction is within it.
        assert gate.max_peak_memory_gib == round(memory_budget_gib(B200), 2) >= evaluation.memory.total
        assert gate.require_falling_loss and not rehearsal_gate(plan, 40, 0.7, require_falling_loss=False
                                                                ).require_falling_loss
        text = render_plan(plan, rehearsal=gate)
        assert f"rehearsal first: 40 steps on {where} x {B200.name}" in text
        assert f"peak memory within {gate.max_peak_memory_gib:,.1f} GiB/GPU and the loss falling" in text
        assert "rehearsal first" not in render_plan(plan)
