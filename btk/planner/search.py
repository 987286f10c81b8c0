"""The knob planner: search the feasible knobs for (profile, instance type, nodes), pick the
fastest, explain each choice in one line, and compare with the legacy baseline.

Search space: every precision the GPU supports, checkpointing ``none``/``selective``/``full``,
FSDP full shard (plus hybrid shard on several nodes, and no shard), tensor parallelism
1/2/4/8 where it divides the KV heads and fits in a node, power-of-two micro-batches up to
the target global batch, ``torch.compile`` and a fused loss on. Pinned knobs restrict the
space. A candidate is feasible when its peak memory is at most ``MEMORY_SAFETY_FRACTION`` of
HBM.

The profile's global batch is a constraint, not a starting point: it is a training
hyperparameter, and changing it changes the model that comes out. Only candidates whose
global batch (micro-batch x accumulation x data-parallel ranks x seq_len) equals
``training.global_batch_tokens`` are kept; where no knob set the hardware can run reaches it
exactly (the target is not a whole number of sequences per data-parallel rank for any
micro-batch and tensor-parallel degree), the smallest batch above it that any of them reaches
is kept instead (:func:`batch_constrained`). When no candidate that fits in memory reaches that
batch, planning fails with one line naming the nearest batches that do fit.

Every feasible candidate within the planner's 1 % speed resolution of the fastest counts
as tied with it (:func:`ties_with`); of those the one with the least memory wins, then the
earlier candidate in a fixed order, so plans are deterministic (:func:`choose_best`).

The *legacy baseline* is what teams port from 80 GB-era configs: full activation
checkpointing, micro-batch 1, bf16, FSDP full shard, eager fp32 cross-entropy (``torch.compile``
on the blocks is kept, so the speed-up shown comes from the memory knobs alone).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from btk.environment import EnvironmentConfig
from btk.errors import InfeasiblePlanError, UnknownNameError
from btk.hardware import InstanceType, get_instance_type
from btk.knobs import (
    CHECKPOINTING_MODES,
    CONTEXT_PARALLEL_DEGREES,
    MAX_GRADIENT_ACCUMULATION_STEPS,
    TENSOR_PARALLEL_DEGREES,
    TrainingKnobs,
    context_parallel_problem,
    knob_combination_problem,
    knobs_to_hyperparameters,
    parse_knobs,
)
from btk.planner.band import ErrorBand, band_for
from btk.planner.cost import TrainingCost, training_cost
from btk.planner.memory import MemoryBreakdown, estimate_memory
from btk.planner.stop_save import StopSave
from btk.planner.throughput import Estimate, estimate_throughput, gradient_accumulation_for
from btk.profile import ModelProfile

MEMORY_SAFETY_FRACTION = 0.90
SPEED_RESOLUTION = 0.01
MAX_MICRO_BATCH = 64
ALTERNATIVES = 4
"""Runner-up knob sets a plan lists."""
PRECISION_ORDER = ("bf16", "fp8_rowwise", "fp8_tensorwise", "mxfp8")
SHARDING_ORDER = ("full_shard", "hybrid_shard", "no_shard")


@dataclass(frozen=True)
class Evaluation:
    """Memory and speed of one knob set on one cluster."""

    knobs: TrainingKnobs
    memory: MemoryBreakdown
    estimate: Estimate
    budget_gib: float

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.budget_gib

    @property
    def shortfall_gib(self) -> float:
        """GiB per GPU over the budget (0 when it fits)."""
        return max(0.0, self.memory.total - self.budget_gib)

    def describe_shortfall(self) -> str:
        """``needs X GiB per GPU, Y GiB over the Z GiB budget (the largest part)``."""
        memory = self.memory
        largest = memory.largest_part()
        return (
            f"needs {memory.total:.1f} GiB per GPU, {self.shortfall_gib:.1f} GiB over the {self.budget_gib:.1f} GiB "
            f"budget ({largest} {getattr(memory, largest):.1f} GiB is the largest part)"
        )

    def as_json(self) -> dict[str, Any]:
        """Knobs, memory and fit; the speed and price only where the knobs fit (a run that cannot happen has none)."""
        return {
            "knobs": self.knobs.model_dump(),
            "memory_gib": self.memory.as_json(),
            "estimate": self.estimate.as_json() if self.fits else None,
            "fits": self.fits,
        }


@dataclass(frozen=True)
class GlobalBatch:
    """The profile's target global batch and the one whole micro-batches reach (rounded up)."""

    requested_tokens: int
    planned_tokens: int

    @property
    def rounded(self) -> bool:
        return self.planned_tokens != self.requested_tokens

    def as_json(self) -> dict[str, Any]:
        return {"requested": self.requested_tokens, "planned": self.planned_tokens, "rounded": self.rounded}


def global_batch(profile: ModelProfile, evaluation: Evaluation) -> GlobalBatch:
    """``training.global_batch_tokens`` against what ``evaluation``'s knobs train per step."""
    return GlobalBatch(profile.training.global_batch_tokens, evaluation.estimate.global_batch_tokens)


def cost_to_train(
    profile: ModelProfile,
    instance: InstanceType,
    nodes: int,
    evaluation: Evaluation,
    plan_duration_hours: int | None = None,
) -> TrainingCost | None:
    """Days and dollars to train ``training.total_tokens`` at ``evaluation``'s speed; None if the profile sets none."""
    total = profile.training.total_tokens
    if total is None:
        return None
    return training_cost(
        total,
        evaluation.estimate.tokens_per_second_per_gpu,
        nodes * instance.gpus_per_node,
        instance.usd_per_hour.value * nodes,
        plan_duration_hours,
    )


@dataclass(frozen=True)
class Scaling:
    """A multi-node plan's tokens/s per GPU against the plan for one node of the same instance type."""

    nodes: int
    tokens_per_second_per_gpu: float
    one_node_tokens_per_second_per_gpu: float | None
    """None where no knob set trains the profile on one node."""
    reason: str | None = None
    """Why there is no one-node figure."""
    knobs: TrainingKnobs | None = None
    """The multi-node plan's knobs."""
    one_node_knobs: TrainingKnobs | None = None
    """The one-node plan's knobs (None where no knob set trains the profile on one node)."""
    knobs_on_one_node: str | None = None
    """Why the multi-node plan's knobs cannot train on one node (None where they can, or no one-node plan)."""

    @property
    def efficiency(self) -> float | None:
        """tokens/s/GPU on ``nodes`` nodes over tokens/s/GPU on one (1.0 = perfect scaling)."""
        if self.one_node_tokens_per_second_per_gpu is None:
            return None
        return self.tokens_per_second_per_gpu / self.one_node_tokens_per_second_per_gpu

    def as_json(self) -> dict[str, Any]:
        one = self.one_node_tokens_per_second_per_gpu
        efficiency = self.efficiency
        return {
            "nodes": self.nodes,
            "one_node_tokens_per_second_per_gpu": None if one is None else round(one, 1),
            "efficiency": None if efficiency is None else round(efficiency, 4),
            "reason": self.reason,
            "knobs_changed": self.knob_changes(),
            "knobs_on_one_node": self.knobs_on_one_node,
        }

    def knob_changes(self) -> dict[str, list[Any]]:
        """The knobs the multi-node plan sets differently from the one-node plan: ``{name: [one node, here]}``.

        More nodes shard parameters, gradients and optimizer state more finely, so a plan on several
        nodes may afford a larger micro-batch or less activation checkpointing than one node can hold:
        that is how its tokens/s per GPU can exceed the one-node plan's (scaling above 100 %).
        """
        if self.knobs is None or self.one_node_knobs is None:
            return {}
        here, one = self.knobs.model_dump(), self.one_node_knobs.model_dump()
        return {name: [one[name], here[name]] for name in NEAREST_KNOBS if one[name] != here[name]}


def scaling_vs_one_node(profile: ModelProfile, instance: InstanceType, nodes: int, evaluation: Evaluation) -> Scaling:
    """``evaluation``'s speed on ``nodes`` nodes against the best plan for one node (same profile, same batch)."""
    speed = evaluation.estimate.tokens_per_second_per_gpu
    try:
        one = plan_profile(profile, instance, 1).evaluation
    except InfeasiblePlanError as error:
        return Scaling(nodes, speed, None, f"no plan on one node: {error}", knobs=evaluation.knobs)
    return Scaling(
        nodes,
        speed,
        one.estimate.tokens_per_second_per_gpu,
        knobs=evaluation.knobs,
        one_node_knobs=one.knobs,
        knobs_on_one_node=_why_not_on_one_node(profile, instance, evaluation.knobs),
    )


def _why_not_on_one_node(profile: ModelProfile, instance: InstanceType, knobs: TrainingKnobs) -> str | None:
    """Why ``knobs`` (hybrid shard read as full shard, the global batch kept) cannot train on one node."""
    if knobs.sharding == "hybrid_shard":
        knobs = knobs.model_copy(update={"sharding": "full_shard"})
    try:
        evaluation = evaluate_knobs(profile, instance, 1, _keep_global_batch(profile, instance, 1, knobs))
    except InfeasiblePlanError as error:
        return str(error)
    return None if evaluation.fits else evaluation.describe_shortfall()


@dataclass(frozen=True)
class Plan:
    """The chosen knobs with their evaluation, the baseline, alternatives and reasons."""

    profile: ModelProfile
    instance: InstanceType
    nodes: int
    evaluation: Evaluation
    baseline: Evaluation | None
    alternatives: tuple[Evaluation, ...]
    explanations: tuple[str, ...]
    candidates: tuple[Evaluation, ...] = field(repr=False, default=())
    scaling: Scaling | None = None
    """Against the one-node plan (None on one node)."""
    ladder: tuple[Evaluation, ...] = ()
    """Where the job steps down to when it runs out of memory before its first checkpoint (:func:`knob_ladder`)."""

    @property
    def knobs(self) -> TrainingKnobs:
        return self.evaluation.knobs

    @property
    def speedup_vs_baseline(self) -> float | None:
        if self.baseline is None:
            return None
        return self.evaluation.estimate.tokens_per_second_per_gpu / self.baseline.estimate.tokens_per_second_per_gpu

    @property
    def global_batch(self) -> GlobalBatch:
        return global_batch(self.profile, self.evaluation)

    @property
    def band(self) -> ErrorBand:
        """How far predictions for this question (GPU family, size, sequence, nodes) missed published runs."""
        return band_for(self.instance, self.profile.parameter_count, self.knobs.seq_len, self.nodes)

    @property
    def stop_save(self) -> StopSave:
        """What a stop's checkpoint writes per node, and the rate it needs to beat SageMaker's kill."""
        return StopSave(self.profile.parameter_count, self.nodes)

    def training_cost(self, plan_duration_hours: int | None = None) -> TrainingCost | None:
        """What ``training.total_tokens`` costs with this plan (training plans of ``plan_duration_hours``)."""
        return cost_to_train(self.profile, self.instance, self.nodes, self.evaluation, plan_duration_hours)

    def hyperparameters(self) -> dict[str, str]:
        return knobs_to_hyperparameters(self.knobs)

    def to_json(self, plan_duration_hours: int | None = None) -> dict[str, Any]:
        """The documented ``btk plan --json`` object (see README, "plan JSON")."""
        chosen = self.evaluation.as_json()
        cost = self.training_cost(plan_duration_hours)
        return {
            "profile": self.profile.name,
            "instance_type": self.instance.name,
            "nodes": self.nodes,
            "gpus": self.nodes * self.instance.gpus_per_node,
            "parameters": self.profile.parameter_count,
            "knobs": chosen["knobs"],
            "memory_gib": chosen["memory_gib"],
            "estimate": chosen["estimate"],
            "global_batch_tokens": self.global_batch.as_json(),
            "training_cost": cost.as_json() if cost is not None else None,
            "baseline": self.baseline.as_json() if self.baseline else None,
            "speedup_vs_baseline": round(self.speedup_vs_baseline, 3) if self.speedup_vs_baseline else None,
            "scaling_vs_one_node": self.scaling.as_json() if self.scaling is not None else None,
            "explanations": list(self.explanations),
            "alternatives": [alternative.as_json() for alternative in self.alternatives],
            "error_band": self.band.as_json(),
            "knob_ladder": [rung.as_json() for rung in self.ladder],
            "stop_save": self.stop_save.as_json(),
        }


def memory_budget_gib(instance: InstanceType) -> float:
    return instance.hbm_gib * MEMORY_SAFETY_FRACTION


def evaluate_knobs(profile: ModelProfile, instance: InstanceType, nodes: int, knobs: TrainingKnobs) -> Evaluation:
    """Memory and speed of a given knob set (no search): ``btk estimate``."""
    check_runnable(profile, instance, nodes, knobs)
    memory = estimate_memory(profile.architecture, knobs, instance.gpus_per_node, nodes, instance.hbm_gib)
    estimate = estimate_throughput(profile.architecture, knobs, instance, nodes)
    return Evaluation(knobs=knobs, memory=memory, estimate=estimate, budget_gib=memory_budget_gib(instance))


def check_runnable(profile: ModelProfile, instance: InstanceType, nodes: int, knobs: TrainingKnobs) -> None:
    """Reject knobs the hardware or the model cannot run, naming the field and the fix."""
    gpu = instance.gpu
    if not gpu.supports(knobs.precision):
        supported = ", ".join(gpu.supported_precisions)
        raise InfeasiblePlanError(
            f"precision {knobs.precision} is not supported on {instance.name} ({gpu.name}); use one of: {supported}"
        )
    arch = profile.architecture
    if knobs.seq_len > arch.max_context:
        raise InfeasiblePlanError(
            f"seq_len {knobs.seq_len} exceeds {profile.name}'s max_context {arch.max_context}; lower seq_len"
        )
    tp, cp = knobs.tensor_parallel, knobs.context_parallel
    if tp > instance.gpus_per_node:
        raise InfeasiblePlanError(f"tensor_parallel {tp} exceeds the {instance.gpus_per_node} GPUs of a node")
    if tp * cp > instance.gpus_per_node:
        raise InfeasiblePlanError(
            f"tensor_parallel {tp} x context_parallel {cp} exceeds the {instance.gpus_per_node} GPUs of a node "
            "(the ranks sharing a sequence stay on one node)"
        )
    if arch.num_kv_heads % tp or arch.num_attention_heads % tp:
        raise InfeasiblePlanError(
            f"tensor_parallel {tp} must divide num_kv_heads ({arch.num_kv_heads}) and "
            f"num_attention_heads ({arch.num_attention_heads})"
        )
    if knobs.sharding == "hybrid_shard" and nodes < 2:
        raise InfeasiblePlanError("sharding hybrid_shard needs at least 2 nodes; use full_shard")
    if nodes < 1:
        raise InfeasiblePlanError("nodes must be at least 1")


def _candidate_values(profile: ModelProfile, instance: InstanceType, nodes: int) -> dict[str, tuple[Any, ...]]:
    arch = profile.architecture
    pins = profile.pinned.as_dict()
    precisions = tuple(p for p in PRECISION_ORDER if instance.gpu.supports(p))
    shardings = tuple(s for s in SHARDING_ORDER if s != "hybrid_shard" or nodes > 1)
    tps = tuple(
        t
        for t in TENSOR_PARALLEL_DEGREES
        if t <= instance.gpus_per_node and arch.num_kv_heads % t == 0 and arch.num_attention_heads % t == 0
    )
    micro_batches = tuple(2**i for i in range(0, 7) if 2**i <= MAX_MICRO_BATCH)
    cps = tuple(c for c in CONTEXT_PARALLEL_DEGREES if c <= instance.gpus_per_node)
    values: dict[str, tuple[Any, ...]] = {
        "precision": precisions,
        "activation_checkpointing": CHECKPOINTING_MODES,
        "sharding": shardings,
        "tensor_parallel": tps,
        "micro_batch_size": micro_batches,
        "compile": (True,),
        "fused_loss": (True,),
        "context_parallel": cps,
    }
    for name, value in pins.items():
        if name in values:
            values[name] = (value,)
    return values


def _accumulation(profile: ModelProfile, instance: InstanceType, nodes: int, micro_batch_size: int, tp: int,
                  cp: int = 1) -> int:
    """Gradient accumulation steps that reach the profile's global batch (or its pin)."""
    training = profile.training
    data_parallel = instance.gpus_per_node * nodes // (tp * cp)
    return profile.pinned.gradient_accumulation_steps or gradient_accumulation_for(
        training.global_batch_tokens, micro_batch_size, training.seq_len, data_parallel
    )


def _within_accumulation_bound(profile: ModelProfile, instance: InstanceType, nodes: int, **choice: Any) -> bool:
    steps = _accumulation(profile, instance, nodes, choice["micro_batch_size"], choice["tensor_parallel"],
                          choice.get("context_parallel", 1))
    return steps <= MAX_GRADIENT_ACCUMULATION_STEPS


def check_accumulation_bound(profile: ModelProfile, instance: InstanceType, nodes: int) -> None:
    """Refuse a global batch that even the largest micro-batch cannot reach within the accumulation bound."""
    values = _candidate_values(profile, instance, nodes)
    if not values["micro_batch_size"] or not values["tensor_parallel"]:
        return
    micro_batch = max(values["micro_batch_size"])
    steps = _accumulation(profile, instance, nodes, micro_batch, min(values["tensor_parallel"]))
    if steps <= MAX_GRADIENT_ACCUMULATION_STEPS:
        return
    training = profile.training
    reach = (
        f"needs {steps:,} gradient accumulation steps of micro-batch {micro_batch} x seq_len {training.seq_len} "
        f"on {nodes} x {instance.name}, more than the {MAX_GRADIENT_ACCUMULATION_STEPS:,} allowed"
    )
    if "micro_batch_size" in profile.pinned.as_dict():
        raise InfeasiblePlanError(
            f"profile {profile.name!r}: pinned.micro_batch_size ({micro_batch}): reaching "
            f"training.global_batch_tokens ({training.global_batch_tokens:,}) {reach}: raise the pin, lower the "
            "batch or add nodes"
        )
    raise InfeasiblePlanError(
        f"profile {profile.name!r}: training.global_batch_tokens ({training.global_batch_tokens:,}) {reach}: "
        "lower it or add nodes"
    )


def _knobs_for(profile: ModelProfile, instance: InstanceType, nodes: int, **choice: Any) -> TrainingKnobs:
    accumulation = _accumulation(profile, instance, nodes, choice["micro_batch_size"], choice["tensor_parallel"],
                                 choice.get("context_parallel", 1))
    return TrainingKnobs(seq_len=profile.training.seq_len, gradient_accumulation_steps=accumulation, **choice)


def _context_parallel_worth_searching(choice: dict[str, Any], seq_len: int, gpus_per_node: int, *,
                                      micro_batch_pinned: bool) -> bool:
    """Whether a knob set with context parallelism can run and be the best one: the trainer takes it
    (:func:`btk.knobs.context_parallel_problem`) and, with the tensor-parallel ranks, it fits in a node. A
    micro-batch above 1 is never searched with it: ``cp`` ranks with micro-batch ``m`` hold the tokens that
    ``m / cp`` sequences without it hold, train the same global batch, and add the key/value gathers; only a single
    sequence too long for one GPU needs it."""
    cp = choice["context_parallel"]
    if cp == 1:
        return True
    return (context_parallel_problem(cp, seq_len, choice["sharding"]) is None
            and choice["tensor_parallel"] * cp <= gpus_per_node
            and (choice["micro_batch_size"] == 1 or micro_batch_pinned))


def enumerate_candidates(profile: ModelProfile, instance: InstanceType, nodes: int) -> list[Evaluation]:
    """Every candidate knob set that the hardware can run (feasible or not), in fixed order."""
    values = _candidate_values(profile, instance, nodes)
    names = list(values)
    micro_pinned = "micro_batch_size" in profile.pinned.as_dict()
    evaluations = []
    seen: set[TrainingKnobs] = set()
    for combination in itertools.product(*(values[name] for name in names)):
        choice = dict(zip(names, combination, strict=True))
        if not _context_parallel_worth_searching(choice, profile.training.seq_len, instance.gpus_per_node,
                                                 micro_batch_pinned=micro_pinned):
            continue
        if (
            choice["micro_batch_size"] * profile.training.seq_len > profile.training.global_batch_tokens
            and choice["micro_batch_size"] > 1
            and not micro_pinned
        ) or not _within_accumulation_bound(profile, instance, nodes, **choice):
            continue
        if knob_combination_problem(choice["precision"], choice["tensor_parallel"]):
            continue
        knobs = _knobs_for(profile, instance, nodes, **choice)
        if knobs in seen:
            continue
        seen.add(knobs)
        evaluations.append(evaluate_knobs(profile, instance, nodes, knobs))
    return evaluations


def _batch_unit(evaluation: Evaluation) -> int:
    """Tokens one micro-batch step trains across the data-parallel ranks."""
    knobs = evaluation.knobs
    return evaluation.estimate.global_batch_tokens // knobs.gradient_accumulation_steps


def achievable_batch(profile: ModelProfile, candidates: Sequence[Evaluation]) -> int:
    """The global batch plans must train: the profile's, or the smallest above it any candidate reaches.

    With pinned gradient accumulation a candidate may fall below the target; the nearest
    batch (the larger on a tie) is taken then.
    """
    target = profile.training.global_batch_tokens
    reached = {candidate.estimate.global_batch_tokens for candidate in candidates}
    if target in reached:
        return target
    return min(reached, key=lambda tokens: (abs(tokens - target), -tokens))


def nearest_fitting_batches(profile: ModelProfile, feasible: Sequence[Evaluation]) -> tuple[int | None, int | None]:
    """The largest global batch below the profile's and the smallest above it that a feasible knob set trains.

    Accumulation is free unless pinned: a candidate trains any whole number (up to the bound) of
    its micro-batch steps.
    """
    target = profile.training.global_batch_tokens
    pinned = profile.pinned.gradient_accumulation_steps
    below: int | None = None
    above: int | None = None
    for candidate in feasible:
        unit = _batch_unit(candidate)
        if pinned:
            reach = [unit * pinned]
        else:
            reach = [steps * unit for steps in (target // unit, target // unit + 1)
                     if 1 <= steps <= MAX_GRADIENT_ACCUMULATION_STEPS]
        for tokens in reach:
            if tokens < target and (below is None or tokens > below):
                below = tokens
            elif tokens > target and (above is None or tokens < above):
                above = tokens
    return below, above


def batch_constrained(profile: ModelProfile, instance: InstanceType, nodes: int,
                      candidates: Sequence[Evaluation]) -> list[Evaluation]:
    """The feasible candidates that train the achievable global batch; InfeasiblePlanError when none fits."""
    batch = achievable_batch(profile, candidates)
    kept = [candidate for candidate in candidates if candidate.fits and candidate.estimate.global_batch_tokens == batch]
    if kept:
        return kept
    target = profile.training.global_batch_tokens
    below, above = nearest_fitting_batches(profile, [candidate for candidate in candidates if candidate.fits])
    nearest = " or ".join(f"{tokens:,}" for tokens in (below, above) if tokens is not None)
    raise InfeasiblePlanError(
        f"profile {profile.name!r}: training.global_batch_tokens ({target:,}) cannot be trained on {nodes} x "
        f"{instance.name}: the knob sets that reach {batch:,} tokens per step do not fit in memory; the nearest "
        f"global batches that fit are {nearest} tokens: set one, or change the node count"
    )


def ties_with(tokens_per_second: float, fastest: float) -> bool:
    """Whether a candidate is as fast as ``fastest`` at the planner's ``SPEED_RESOLUTION``.

    The models are not accurate to better than a few per cent, so a candidate at most 1 %
    slower than the fastest counts as equally fast, and the tie goes to less memory.
    """
    return tokens_per_second >= fastest * (1 - SPEED_RESOLUTION)


def _speed(evaluation: Evaluation) -> float:
    return evaluation.estimate.tokens_per_second_per_gpu


def choose_best(feasible: Sequence[Evaluation]) -> Evaluation:
    """The documented rule: of the candidates tied with the fastest, the least memory, then the earliest."""
    fastest = max(_speed(evaluation) for evaluation in feasible)
    tied = [evaluation for evaluation in feasible if ties_with(_speed(evaluation), fastest)]
    return min(tied, key=lambda evaluation: evaluation.memory.total)  # min keeps the earliest of equals


def rank(feasible: Sequence[Evaluation], count: int) -> list[Evaluation]:
    """The first ``count`` candidates in :func:`choose_best` order (the best, then the best of the rest, ...)."""
    remaining = list(feasible)
    ranked: list[Evaluation] = []
    while remaining and len(ranked) < count:
        best = choose_best(remaining)
        ranked.append(best)
        remaining.remove(best)
    return ranked


def _pin_overflow_message(profile: ModelProfile, instance: InstanceType, candidates: list[Evaluation]) -> str:
    pins = ", ".join(f"{key}={value}" for key, value in profile.pinned.as_dict().items())
    smallest = min(candidates, key=lambda evaluation: evaluation.memory.total)
    prefix = f"pinned {pins} does not fit" if pins else f"{profile.name} does not fit"
    return (
        f"{prefix} on {instance.name}: the smallest configuration {smallest.describe_shortfall()}; add nodes, "
        "raise tensor_parallel or unpin"
    )


LEGACY_BASELINE: dict[str, Any] = {
    "micro_batch_size": 1,
    "precision": "bf16",
    "activation_checkpointing": "full",
    "sharding": "full_shard",
    "tensor_parallel": 1,
    "compile": True,
    "fused_loss": False,
}


def legacy_baseline_knobs(profile: ModelProfile, instance: InstanceType, nodes: int) -> TrainingKnobs | None:
    """The legacy baseline's knobs; ``None`` when micro-batch 1 needs more accumulation steps than allowed."""
    if not _within_accumulation_bound(profile, instance, nodes, **LEGACY_BASELINE):
        return None
    return _knobs_for(profile, instance, nodes, **LEGACY_BASELINE)


def with_settings(profile: ModelProfile, settings: Mapping[str, Any]) -> ModelProfile:
    """``profile`` as ``btk plan``/``btk compare`` plan it with ``--set``: ``seq_len`` becomes its training sequence
    (the global batch in tokens is kept), every other knob a pin the search honours.

    Raises:
        BtkError: one line naming a value no knob set can take (``parse_knobs``'s rules, checked at the
            profile's sequence length or the one set).
    """
    if not settings:
        return profile
    probe = parse_knobs({"micro_batch_size": 1, "seq_len": profile.training.seq_len, **settings})
    pins = {name: getattr(probe, name) for name in settings if name != "seq_len"}
    training = profile.training.model_copy(update={"seq_len": probe.seq_len})
    return profile.model_copy(update={"training": training, "pinned": profile.pinned.model_copy(update=pins)})


def plan_profile(profile: ModelProfile, instance: InstanceType, nodes: int = 1) -> Plan:
    """Search the knobs and return the fastest feasible plan.

    Raises:
        InfeasiblePlanError: nothing fits (naming what overflows and by how much), or a pin
            the hardware cannot run.
    """
    if nodes < 1:
        raise InfeasiblePlanError("nodes must be at least 1")
    pins = profile.pinned.as_dict()
    pinned_problem = knob_combination_problem(profile.pinned.precision or "bf16", profile.pinned.tensor_parallel or 1)
    if pinned_problem:
        raise InfeasiblePlanError(f"{profile.name}: pinned {pinned_problem}")
    if "precision" in pins:
        check_runnable(
            profile,
            instance,
            nodes,
            TrainingKnobs(micro_batch_size=1, seq_len=profile.training.seq_len, precision=pins["precision"]),
        )
    check_accumulation_bound(profile, instance, nodes)
    candidates = enumerate_candidates(profile, instance, nodes)
    if not candidates:
        raise InfeasiblePlanError(f"no knob set of {profile.name} can run on {instance.name} with these pins")
    if not any(c.fits for c in candidates):
        raise InfeasiblePlanError(_pin_overflow_message(profile, instance, candidates))
    feasible = batch_constrained(profile, instance, nodes, candidates)
    batch = feasible[0].estimate.global_batch_tokens
    candidates = [c for c in candidates if c.estimate.global_batch_tokens == batch]  # the rivals train the same batch
    best, *alternatives = rank(feasible, ALTERNATIVES + 1)
    baseline_knobs = legacy_baseline_knobs(profile, instance, nodes)
    baseline = evaluate_knobs(profile, instance, nodes, baseline_knobs) if baseline_knobs is not None else None
    return Plan(
        profile=profile,
        instance=instance,
        nodes=nodes,
        ladder=knob_ladder(best, candidates),
        evaluation=best,
        baseline=baseline if baseline is not None and baseline.fits else None,
        alternatives=tuple(alternatives),
        explanations=tuple(explain(best, candidates, pins)),
        candidates=tuple(candidates),
        scaling=scaling_vs_one_node(profile, instance, nodes, best) if nodes > 1 else None,
    )


def rehearsal_nodes(profile: ModelProfile, instance: InstanceType, nodes: int,
                    knobs: TrainingKnobs) -> tuple[int, Evaluation]:
    """Where a rehearsal of ``knobs`` (planned for ``nodes``) runs: one node where the planner says they fit
    there (model state sharded over fewer GPUs needs more memory each), else all ``nodes``; with the planner's
    evaluation there, what the rehearsal's measured speed is held against."""
    if nodes > 1:
        try:
            one = evaluate_knobs(profile, instance, 1, knobs)
        except InfeasiblePlanError:
            one = None
        if one is not None and one.fits:
            return 1, one
    return nodes, evaluate_knobs(profile, instance, nodes, knobs)


@dataclass(frozen=True)
class RehearsalGate:
    """What a plan's rehearsal runs on, what it costs, and the speed it must reach (``EnvironmentConfig.rehearsal``)."""

    nodes: int
    steps: int
    predicted_tokens_per_second_per_gpu: float
    min_tokens_per_second_per_gpu: float
    training_seconds: float
    """The rehearsal's steps at the predicted speed: start-up, data staging and compilation come on top."""
    usd: float
    """``training_seconds`` at the catalog's hourly price for ``nodes`` (an estimate where the catalog says so)."""
    max_peak_memory_gib: float
    """Peak allocated memory per GPU the rehearsal may reach (:func:`rehearsal_memory_limit_gib`)."""
    require_falling_loss: bool
    predicted_mfu: float
    """The planner's MFU for the rehearsal (of the dense bf16 peak), printed beside the measured one."""
    predicted_memory_gib: float
    """The planner's peak memory per GPU for the rehearsal, printed beside the measured one."""

    def as_json(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "steps": self.steps,
                "predicted_tokens_per_second_per_gpu": round(self.predicted_tokens_per_second_per_gpu, 1),
                "predicted_mfu": round(self.predicted_mfu, 4),
                "predicted_memory_gib": round(self.predicted_memory_gib, 1),
                "min_tokens_per_second_per_gpu": self.min_tokens_per_second_per_gpu,
                "max_peak_memory_gib": self.max_peak_memory_gib, "require_falling_loss": self.require_falling_loss,
                "training_seconds": round(self.training_seconds), "usd": round(self.usd, 2)}


def rehearsal_gate(plan: Plan, steps: int, min_throughput_share: float, *,
                   require_falling_loss: bool = True) -> RehearsalGate:
    """The rehearsal of ``plan`` (:func:`rehearsal_nodes`) and its gate: ``min_throughput_share`` of the planner's
    tokens/s per GPU for the rehearsal, rounded to 0.1 as the pipeline's condition holds it; memory within the
    budget; the loss falling where ``require_falling_loss``."""
    nodes, evaluation = rehearsal_nodes(plan.profile, plan.instance, plan.nodes, plan.knobs)
    predicted = evaluation.estimate.tokens_per_second_per_gpu
    seconds = steps * evaluation.estimate.step_seconds
    return RehearsalGate(nodes, steps, predicted, rehearsal_threshold(predicted, min_throughput_share), seconds,
                         seconds / 3600 * nodes * plan.instance.usd_per_hour.value,
                         rehearsal_memory_limit_gib(plan.instance), require_falling_loss,
                         evaluation.estimate.mfu, evaluation.memory.total)


def rehearsal_memory_limit_gib(instance: InstanceType) -> float:
    """The peak allocated memory per GPU a rehearsal may reach, to 0.01 GiB: the planner's budget, which every plan's
    prediction fits (a rehearsal above it ran closer to out-of-memory than the plan allows for)."""
    return round(memory_budget_gib(instance), 2)


def rehearsal_threshold(predicted_tokens_per_second_per_gpu: float, min_throughput_share: float) -> float:
    """The tokens/s per GPU a rehearsal must reach, to 0.1 (what the pipeline's condition holds)."""
    return round(predicted_tokens_per_second_per_gpu * min_throughput_share, 1)


LADDER_RUNGS = 2
"""Rungs below the plan: enough to survive a memory estimate that is off by a quarter, few enough to fail fast."""
LADDER_MEMORY_STEP = 0.9
"""Each rung is predicted to need at most this share of the memory of the one above it."""
LADDER_KEPT = ("seq_len", "precision", "tensor_parallel", "context_parallel", "compile", "fused_loss")
"""What a rung keeps from the plan: what is trained and how (a step down changes memory knobs only)."""


def knob_ladder(best: Evaluation, candidates: Sequence[Evaluation]) -> tuple[Evaluation, ...]:
    """The knob sets a job steps down to when it runs out of memory before its first checkpoint, in order.

    The fastest candidates that fit, train the plan's global batch and keep :data:`LADDER_KEPT`,
    each predicted to need at most :data:`LADDER_MEMORY_STEP` of the memory of the rung above
    (the first rung: of the plan), so every step down buys real headroom; at most
    :data:`LADDER_RUNGS`. Empty when nothing leaner fits (the plan is already the leanest).
    """
    same = [c for c in candidates if c.fits and c.estimate.global_batch_tokens == best.estimate.global_batch_tokens
            and all(getattr(c.knobs, name) == getattr(best.knobs, name) for name in LADDER_KEPT)]
    rungs: list[Evaluation] = []
    above = best
    for candidate in sorted(same, key=lambda c: -_speed(c)):
        if len(rungs) == LADDER_RUNGS:
            break
        if candidate.memory.total <= above.memory.total * LADDER_MEMORY_STEP:
            rungs.append(candidate)
            above = candidate
    return tuple(rungs)


EXPLAINED_KNOBS = ("activation_checkpointing", "micro_batch_size", "precision", "sharding", "tensor_parallel",
                   "context_parallel")


def explain(best: Evaluation, candidates: list[Evaluation], pins: dict[str, Any]) -> list[str]:
    """One line per knob: why this value, against the best candidate with another value."""
    lines = []
    chosen = best.knobs
    spare = best.budget_gib - best.memory.total
    fastest = max(_speed(c) for c in candidates if c.fits)
    for name in EXPLAINED_KNOBS:
        value = getattr(chosen, name)
        if name == "context_parallel" and value == 1 and name not in pins:
            continue  # explained only where a plan shares its sequences
        if name in pins:
            lines.append(f"{name} {value}: pinned by the profile")
            continue
        others = [c for c in candidates if getattr(c.knobs, name) != value]
        if not others:
            lines.append(f"{name} {value}: the only value this hardware and model allow")
            continue
        feasible_others = [c for c in others if c.fits]
        if name == "activation_checkpointing" and value == "none":
            lines.append(f"activation checkpointing off: fits with {spare:.0f} GiB to spare")
            continue
        if feasible_others:
            rival = choose_best(feasible_others)
            slower = 1 - rival.estimate.tokens_per_second_per_gpu / best.estimate.tokens_per_second_per_gpu
            rival_value = getattr(rival.knobs, name)
            if ties_with(_speed(rival), fastest):  # tied with the fastest, so it needs at least as much memory
                saved = rival.memory.total - best.memory.total
                lines.append(
                    f"{name} {value}: as fast as {rival_value} within the planner's "
                    f"{SPEED_RESOLUTION:.0%} resolution, with {saved:.0f} GiB less memory"
                )
                continue
            lines.append(
                f"{name} {value}: best alternative {rival_value} is {slower:.1%} slower "
                f"({rival.estimate.tokens_per_second_per_gpu:,.0f} vs "
                f"{best.estimate.tokens_per_second_per_gpu:,.0f} tokens/s/GPU)"
            )
        else:
            smallest = min(others, key=lambda c: c.memory.total)
            lines.append(
                f"{name} {value}: every other value overflows memory "
                f"(at best {smallest.memory.total:.0f} GiB > {best.budget_gib:.0f} GiB budget)"
            )
    return lines


def plan_environment(env: EnvironmentConfig) -> dict[str, Plan]:
    """Plans for every profile of an environment on its instance type and count."""
    from btk.catalog import environment_profiles

    try:
        instance = get_instance_type(env.instance_type)
    except UnknownNameError as error:
        raise UnknownNameError(f"environment {env.name!r}: instance_type: {error}") from None
    return {
        name: plan_profile(profile, instance, env.instance_count) for name, profile in environment_profiles(env).items()
    }


#: Knobs whose change alters the tokens one micro-step trains, so the accumulation is recomputed.
BATCH_SHAPING_KNOBS = ("micro_batch_size", "seq_len", "tensor_parallel", "context_parallel")


@dataclass(frozen=True)
class WhatIf:
    """``btk estimate``'s knobs: where they started, what was changed, and their evaluation."""

    start: str
    """``"plan"`` (the planner's choice for this cluster) or ``"micro-batch 1"`` where no plan fits."""
    changed: tuple[str, ...]
    """The knobs set explicitly, in the order given."""
    accumulation_recomputed: bool
    """Whether gradient accumulation was recomputed to keep the profile's global batch."""
    evaluation: Evaluation
    global_batch: GlobalBatch
    nearest: Evaluation | None = None
    """Where ``evaluation`` does not fit: the fitting knob set nearest to it (:func:`nearest_fitting`)."""

    def changed_to_fit(self) -> list[str]:
        """``knob old -> new`` for every searched knob :attr:`nearest` changes (empty without one)."""
        if self.nearest is None:
            return []
        return [
            f"{name} {getattr(self.evaluation.knobs, name)} -> {getattr(self.nearest.knobs, name)}"
            for name in NEAREST_KNOBS
            if getattr(self.evaluation.knobs, name) != getattr(self.nearest.knobs, name)
        ]


#: The knobs :func:`nearest_fitting` counts changes of, and :meth:`Scaling.knob_changes` compares (gradient
#: accumulation follows from them).
NEAREST_KNOBS = (
    "micro_batch_size",
    "activation_checkpointing",
    "precision",
    "sharding",
    "tensor_parallel",
    "context_parallel",
    "compile",
    "fused_loss",
)


def nearest_fitting(
    profile: ModelProfile, instance: InstanceType, nodes: int, knobs: TrainingKnobs
) -> Evaluation | None:
    """The searched knob set that fits and changes fewest of ``knobs``' values, the fastest of those; None if none fits.

    The search runs at ``knobs``' sequence length and keeps the profile's global batch and pins.
    """
    training = profile.training.model_copy(update={"seq_len": knobs.seq_len})
    at_length = profile.model_copy(update={"training": training})
    try:
        check_accumulation_bound(at_length, instance, nodes)
    except InfeasiblePlanError:
        return None
    fitting = [candidate for candidate in enumerate_candidates(at_length, instance, nodes) if candidate.fits]
    if not fitting:
        return None

    def distance(candidate: Evaluation) -> tuple[int, float, float]:
        changes = sum(getattr(candidate.knobs, name) != getattr(knobs, name) for name in NEAREST_KNOBS)
        return changes, -_speed(candidate), candidate.memory.total

    return min(fitting, key=distance)


def what_if(profile: ModelProfile, instance: InstanceType, nodes: int, overrides: Mapping[str, Any]) -> WhatIf:
    """The plan's knobs for ``nodes`` x ``instance`` with ``overrides`` applied, evaluated (no search).

    The profile's global batch is kept: when ``overrides`` change the tokens of a micro-step
    (:data:`BATCH_SHAPING_KNOBS`), gradient accumulation is recomputed unless ``overrides`` or
    the profile's pins set ``gradient_accumulation_steps``. Where no knob set fits, the start
    is micro-batch 1 with the profile's pins. Where the result does not fit, the nearest knob
    set that does is found too (:func:`nearest_fitting`).
    """
    try:
        start, values = "plan", plan_profile(profile, instance, nodes).knobs.model_dump()
    except InfeasiblePlanError:
        start = "micro-batch 1"
        values = {"micro_batch_size": 1, "seq_len": profile.training.seq_len, **profile.pinned.as_dict()}
    knobs = parse_knobs(values | dict(overrides))
    fixed = "gradient_accumulation_steps" in overrides or "gradient_accumulation_steps" in profile.pinned.as_dict()
    recompute = not fixed and (start != "plan" or any(name in overrides for name in BATCH_SHAPING_KNOBS))
    if recompute:
        knobs = _keep_global_batch(profile, instance, nodes, knobs)
    evaluation = evaluate_knobs(profile, instance, nodes, knobs)
    nearest = None if evaluation.fits else nearest_fitting(profile, instance, nodes, knobs)
    return WhatIf(start, tuple(overrides), recompute, evaluation, global_batch(profile, evaluation), nearest)


def _keep_global_batch(
    profile: ModelProfile, instance: InstanceType, nodes: int, knobs: TrainingKnobs
) -> TrainingKnobs:
    """``knobs`` with the gradient accumulation that reaches the profile's global batch."""
    check_runnable(profile, instance, nodes, knobs)  # a tensor_parallel the node cannot hold fails here, by name
    data_parallel = instance.gpus_per_node * nodes // (knobs.tensor_parallel * knobs.context_parallel)
    target = profile.training.global_batch_tokens
    steps = gradient_accumulation_for(target, knobs.micro_batch_size, knobs.seq_len, data_parallel)
    if steps > MAX_GRADIENT_ACCUMULATION_STEPS:
        raise InfeasiblePlanError(
            f"keeping the {target:,}-token global batch with micro_batch_size {knobs.micro_batch_size} x seq_len "
            f"{knobs.seq_len} on {data_parallel} data-parallel ranks needs {steps:,} gradient accumulation steps, "
            f"more than the {MAX_GRADIENT_ACCUMULATION_STEPS:,} allowed: raise micro_batch_size or set "
            "gradient_accumulation_steps"
        )
    return knobs.model_copy(update={"gradient_accumulation_steps": steps})


def longest_sequence_one_node(profile: ModelProfile, instance: InstanceType, step: int = 1024) -> int:
    """Longest seq_len (a multiple of ``step``, ≤ max_context) that trains on one node, TP 1.

    Uses micro-batch 1, FSDP full shard, full activation checkpointing and a fused loss: the
    most memory-frugal knobs, so this answers "what experiments become possible".
    """
    arch = profile.architecture

    def fits(seq_len: int) -> bool:
        knobs = TrainingKnobs(
            micro_batch_size=1,
            seq_len=seq_len,
            activation_checkpointing="full",
            sharding="full_shard",
            tensor_parallel=1,
            precision="bf16",
        )
        memory = estimate_memory(arch, knobs, instance.gpus_per_node, 1, instance.hbm_gib)
        return memory.total <= memory_budget_gib(instance)

    low, high = 0, arch.max_context // step
    if high == 0 or not fits(step):
        return 0
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid * step):
            low = mid
        else:
            high = mid - 1
    return low * step
