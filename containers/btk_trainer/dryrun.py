"""A dry run of the trainer at full size without a GPU: the real model, parallelism and steps on fake tensors.

    python -m btk_trainer.dryrun --env prod                        # every profile of an environment, as planned
    python -m btk_trainer.dryrun --profile qwen2.5-32b --env prod --set micro_batch_size=8
    python -m btk_trainer.dryrun --profile llama-65b --instance-type ml.p6-b200.48xlarge --nodes 2
    python -m btk_trainer.dryrun --shipped --format markdown       # every environment's plans and one baseline

For a profile on an instance type and node count, with the planner's knobs (``--set`` overrides
them), the trainer's own code builds the model and trains one optimizer step as rank 0 of the
job's real world size: :func:`btk_trainer.train.build_model` (the :class:`~btk_trainer.model.Decoder`
on the meta device, :func:`~btk_trainer.parallelize.parallelize` with the plan's float8 or
MXFP8 conversion, tensor-parallel plan, activation checkpointing and FSDP2 groups, then
``to_empty`` and ``init_weights``), the trainer's optimizer, data sampler, micro-batch loop
(:func:`~btk_trainer.train.forward_backward`), gradient clipping and fused AdamW step, all
after the job's hyperparameters went through the pipeline's string codec. Every tensor is a
``FakeTensor`` (shape, dtype and strides, no storage) and every collective goes to a fake
process group (``torch.testing._internal.distributed.fake_pg``) of the job's world size, so a
32B model over 16 GPUs runs in one process on a laptop's CPU.

The measured step runs one micro-batch in the steady state: with the optimizer's state and, when
the plan accumulates gradients, with gradients resident, as every micro-batch after the first of
every step runs. The state it starts from is what a first step leaves, made without that step's
forward and backward (which would double the run's time and leave nothing the measured step
reads): every sharded parameter gets a gradient of its own shape, dtype and placement (what
FSDP2's reduce-scatter assigns), then the optimizer update runs as the trainer's does, creating
the AdamW moments and, under float8 all-gather, the precomputed scales.
``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker`` counts every tensor's storage by
category (:class:`PeakTracker` corrects three of its behaviours); the figures sit beside the
planner's (:func:`btk.planner.memory.estimate_memory`) for the knobs the dry run executed.

What runs differs from a GPU job in four stated ways. ``torch.compile`` is off (a fake tensor
cannot be compiled), so blocks and loss run eagerly, with the eager norms' fp32 intermediates
and the eager loss chunk's fp32 logits; the dry run is compared with the planner's prediction
for the same eager knobs, and the plan's own (compiled) peak is *projected* as the dry run's
peak plus the planner's compiled-minus-eager difference. The device is the CPU: attention is
torch's CPU flash kernel (it saves the same output and log-sum-exp as the CUDA kernels).
MXFP8 runs in torchao's emulation, whose autograd function saves the same bf16 input and
weight as its Blackwell kernels. Under context parallelism or document masking the CPU attends
through a dense mask where a GPU takes a block mask of kilobytes; the dry run leaves it out of its
count (:func:`dense_mask_gib`); so it does with the dense mask of Gemma's windowed blocks. Synthetic windows
are one document each, so a document-masked plan builds and applies its masks at full size, over one
document per window. Soft-capped attention (Gemma 2) runs through SDPA uncapped
(:attr:`~btk_trainer.model.Attention.exact_soft_capping_off_cuda`): the CPU has no fused kernel that caps,
and what a GPU's ``flex_attention`` keeps for backward is what SDPA keeps.

Exit status: 0 when every case passes; 1 when one fails (the real code raised, the projected
peak exceeds the instance's memory budget, or the dry run is further than ``--tolerance``
from the planner); 2 for bad input (one line).
"""
from __future__ import annotations

import argparse
import functools
import gc
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPRefType, _SavedFSDPMethods
from torch.distributed.tensor._sharding_prop import ShardingPropagator

from btk.catalog import all_environments, get_environment, get_profile
from btk.cli.arguments import max_nodes
from btk.cli.planning import parse_settings
from btk.errors import BtkError, printable
from btk.hardware import InstanceType, get_instance_type
from btk.hyperparameters import JobHyperparameters, JobSettings, from_hyperparameters, to_hyperparameters
from btk.knobs import TrainingKnobs, parse_knobs
from btk.planner.memory import MemoryBreakdown, estimate_memory
from btk.planner.render import context_parallel_suffix
from btk.planner.search import memory_budget_gib, plan_profile, with_settings
from btk.profile import ModelArchitecture, ModelProfile, TrainingIntent
from btk.table import Column, Table
from btk_trainer.model import Attention, Decoder, eager_cross_entropy
from btk_trainer.parallelize import (
    build_mesh,
    check_precision,
    data_parallel_rank,
    float8_all_gather_enabled,
    mesh_shape,
    train_context,
)

GIB = 1024**3
DEFAULT_TOLERANCE = 0.10
"""How far the dry run's peak may be from the planner's prediction for the same knobs (see docs/trainer.md)."""

CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "temporaries", "in_flight")
_CATEGORY_OF_REFERENCE = {
    "Sharded Param": "parameters",
    "Buffer": "parameters",
    "Sharded Grad": "gradients",
    "OptState": "optimizer",
    "Activation": "activations",
    "Inputs": "activations",
    "Temp": "temporaries",
    "Unsharded Param": "in_flight",
    "All Gather": "in_flight",
    "Unsharded Grad": "in_flight",
    "Reduce Scatter": "in_flight",
}
"""FSDPMemTracker's reference types, grouped as the planner's categories: FSDP2's fp32 master shards, sharded
gradients, AdamW moments; tensors made in forward (and in a checkpointed block's recompute) and the batch;
tensors made in backward (activation gradients, the logits' gradient); and FSDP's gathered parameters and
unsharded gradients with their communication buffers (the planner's ``other``)."""


@dataclass(frozen=True)
class MeasuredMemory:
    """Rank 0's memory at the dry run's peak, GiB by category, and where in the step the peak was."""

    parameters: float
    gradients: float
    optimizer: float
    activations: float
    temporaries: float
    in_flight: float
    total: float
    phase: str
    """``forward``, ``loss`` (inside the output head's forward), ``backward`` or ``optimizer``."""

    def as_json(self) -> dict[str, Any]:
        return {**{name: round(getattr(self, name), 2) for name in (*CATEGORIES, "total")}, "phase": self.phase}


class PeakTracker(FSDPMemTracker):  # type: ignore[no-untyped-call]  # torch's __init_subclass__ is unannotated
    """``FSDPMemTracker`` that counts a run under ``FakeTensorMode`` as it counts a real one, and only its peak.

    * DTensor computes each operation's output shape by running the operation on fake tensors
      of the *global* shape (``ShardingPropagator._propagate_tensor_meta_non_cached``). It
      reuses the fake mode that is active, so under an outer ``FakeTensorMode`` those
      full-size tensors reach the tracker like real ones; the tracker's own guard skips them
      only when they run under a fake mode other than the one active at its entry. Every
      sharded parameter's global-shape moment then counts towards the optimizer's peak (a
      Llama 8B over 8 ranks showed 30 GiB of "optimizer state" for 1.8 GiB of moments).
      Here every operation inside that propagation is left out.
    * It re-registers every FSDP state's forward hooks on each of the state's modules, so a
      group of several modules (the trainer's ``fully_shard([norm, lm_head])``) runs its
      pre-forward on each, registers its post-backward twice and reduce-scatters its
      gradients in two halves; with HSDP's all-reduce deferred over micro-batches the halves
      no longer add up and the step fails. Here a group's wrapped hooks are registered the way
      ``fully_shard`` registers them (FSDP2's group hooks: pre-forward before the first module,
      post-forward after the last).
    * The tracker updates each active module's own peak on every operation, walking every
      tracked module each time (quadratic in the depth of the model); only the global peak
      is kept here, with the phase of the step it happened in.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        super().__init__(model, optimizer)
        self._propagating = 0
        self._original_propagation: Callable[..., Any] | None = None
        self.peak_phase = "none"

    def __enter__(self) -> PeakTracker:
        if self._depth == 0:
            original = ShardingPropagator._propagate_tensor_meta_non_cached
            tracker = self

            def propagate_untracked(propagator: ShardingPropagator, op_schema: Any) -> Any:
                tracker._propagating += 1
                try:
                    return original(propagator, op_schema)
                finally:
                    tracker._propagating -= 1

            self._original_propagation = original
            ShardingPropagator._propagate_tensor_meta_non_cached = propagate_untracked  # type: ignore[method-assign,assignment]
        super().__enter__()
        return self

    def __exit__(self, *args: Any) -> None:
        super().__exit__(*args)
        if self._depth == 0 and self._original_propagation is not None:
            ShardingPropagator._propagate_tensor_meta_non_cached = self._original_propagation  # type: ignore[method-assign]
            self._original_propagation = None

    def _instrument_fsdp_module(self) -> None:
        for module, state, group in _fsdp_states(self._root_mod):
            self._instrument_fsdp_sharded_params_grads(group)
            _remove_forward_hooks(state)
            _register_forward_hooks(state, self._fsdp_state_pre_forward(module, state._pre_forward),
                                    self._fsdp_state_post_forward(module, state._post_forward))
            self._fsdp_mod_to_saved_methods[module] = _SavedFSDPMethods(group.pre_backward, group.post_backward)
            group.pre_backward = self._fsdp_param_group_pre_backward(module, group.pre_backward)
            group.post_backward = self._fsdp_param_group_post_backward(module, group.post_backward)
        for buffer in self._root_mod.buffers():
            self._update_and_maybe_create_winfos(buffer, _FSDPRefType.BUFFER)

    def _deregister_module_and_optimizer_hooks(self) -> None:
        for module, saved in self._fsdp_mod_to_saved_methods.items():  # type: ignore[no-untyped-call]  # unannotated
            state = module._get_fsdp_state()
            _remove_forward_hooks(state)
            _register_forward_hooks(state, state._pre_forward, state._post_forward)
            if (group := state._fsdp_param_group) is not None:
                group.pre_backward, group.post_backward = saved.pre_backward, saved.post_backward
        self._fsdp_mod_to_saved_methods.clear()
        if self._optimizer_hook_handles is not None:
            for handle in self._optimizer_hook_handles:
                handle.remove()
            self._optimizer_hook_handles = None

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self._propagating:
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)  # type: ignore[no-untyped-call]  # unannotated

    def _update_peak_stats(self, peak_state: Any) -> None:
        for device, snapshot in self._curr_mem_snap.items():
            if snapshot["Total"] > self._peak_mem.get(device, 0):
                self._peak_mem[device] = snapshot["Total"]
                self._peak_mem_snap[device] = dict(snapshot)
                self.peak_phase = self._phase()

    def reset_peak(self) -> None:
        """Forget the peak so far: what is measured next is one step's own peak."""
        self._peak_mem.clear()
        self._peak_mem_snap.clear()
        self.peak_phase = "none"

    def _phase(self) -> str:
        if self._in_opt:
            return "optimizer"
        if self._mod_tracker.is_bw:
            return "backward"
        if any(name.endswith(".lm_head") for name in self._mod_tracker.parents):
            return "loss"
        return "forward"

    def measured(self) -> MeasuredMemory:
        """The peak snapshot by category (the CPU is the one device a dry run allocates on)."""
        snapshot = self.get_tracker_snapshot("peak").get(torch.device("cpu"), {})
        totals = dict.fromkeys(CATEGORIES, 0.0)
        for reference, size in snapshot.items():
            if isinstance(reference, _FSDPRefType):  # and the "Total" key
                totals[_CATEGORY_OF_REFERENCE[reference.value]] += size / GIB
        return MeasuredMemory(**totals, total=snapshot.get("Total", 0) / GIB, phase=self.peak_phase)


def _fsdp_states(root: torch.nn.Module) -> Iterator[tuple[Any, Any, Any]]:
    """(first module, FSDP state, parameter group) of every FSDP state under ``root`` with parameters, once each."""
    from torch.distributed.fsdp import FSDPModule

    seen: set[int] = set()
    for module in root.modules():
        if isinstance(module, FSDPModule):
            state = module._get_fsdp_state()
            if id(state) not in seen and state._fsdp_param_group is not None:
                seen.add(id(state))
                yield module, state, state._fsdp_param_group


def _remove_forward_hooks(state: Any) -> None:
    state._pre_forward_hook_handle.remove()
    state._post_forward_hook_handle.remove()


def _register_forward_hooks(state: Any, pre_forward: Callable[..., Any], post_forward: Callable[..., Any]) -> None:
    """Register a state's forward hooks as ``fully_shard`` does: on its module, or as a group over its modules."""
    from torch.distributed.fsdp._fully_shard._fsdp_state import _register_group_forward_hooks

    modules = state._modules
    if len(modules) == 1:
        state._pre_forward_hook_handle = modules[0].register_forward_pre_hook(pre_forward, prepend=True,
                                                                              with_kwargs=True)
        state._post_forward_hook_handle = modules[0].register_forward_hook(post_forward, prepend=False)
    else:
        handle = _register_group_forward_hooks(modules, pre_forward, post_forward, state._modules_to_run_forward,
                                               state._cast_output_dtype)
        state._pre_forward_hook_handle = state._post_forward_hook_handle = handle


@dataclass(frozen=True)
class DryRunCase:
    """What to run: a model, its training intent, the cluster and the knobs as planned."""

    name: str
    """The profile's name (the job's ``job.profile``)."""
    architecture: ModelArchitecture
    training: TrainingIntent
    instance: InstanceType
    nodes: int
    knobs: TrainingKnobs
    label: str = "plan"
    """``plan``, ``baseline`` (the planner's legacy baseline), ``--set`` (knobs changed by hand) or a published run."""
    whole_logits: bool = False
    """The loss holds the micro-batch's logits whole (:func:`~btk_trainer.model.eager_cross_entropy`), as the
    published runs the planner is calibrated on did; the trainer's own loss is chunked."""

    @property
    def world_size(self) -> int:
        return self.instance.gpus_per_node * self.nodes

    @property
    def executed_knobs(self) -> TrainingKnobs:
        """The knobs the dry run trains with: the plan's, eager (fake tensors cannot be compiled)."""
        return self.knobs.model_copy(update={"compile": False, "fused_loss": False})

    def spec(self) -> JobHyperparameters:
        """The job's hyperparameters, through the same string codec the pipeline hands the trainer."""
        spec = JobHyperparameters(knobs=self.executed_knobs, architecture=self.architecture, training=self.training,
                                  job=JobSettings(profile=self.name))
        return from_hyperparameters(to_hyperparameters(spec))

    def predict(self, knobs: TrainingKnobs) -> MemoryBreakdown:
        return estimate_memory(self.architecture, knobs, self.instance.gpus_per_node, self.nodes,
                               self.instance.hbm_gib, whole_logits=self.whole_logits)


@dataclass(frozen=True)
class DryRunResult:
    """One case's dry run beside the planner's predictions."""

    case: DryRunCase
    predicted: MemoryBreakdown
    """The planner's figures for the knobs the dry run executed (eager)."""
    planned: MemoryBreakdown
    """The planner's figures for the knobs as planned (compiled, fused loss)."""
    budget_gib: float
    measured: MeasuredMemory | None
    error: str | None
    seconds: float

    @property
    def difference(self) -> float | None:
        """(dry run - prediction) / prediction, for the knobs that ran."""
        if self.measured is None:
            return None
        return self.measured.total / self.predicted.total - 1

    @property
    def projected_gib(self) -> float | None:
        """The plan's own peak: the dry run's, plus what the planner says compile and the fused loss change."""
        if self.measured is None:
            return None
        return self.measured.total + self.planned.total - self.predicted.total

    @property
    def memory_compared(self) -> bool:
        """Whether the peak says something about the GPU's: not under a precision the CPU emulates, whose
        temporaries are the emulation's (:data:`EMULATED_PRECISIONS`)."""
        return self.case.knobs.precision not in EMULATED_PRECISIONS

    def problems(self, tolerance: float) -> list[str]:
        """Why this case fails, one line each; empty when it passes (an emulated precision: when it builds and
        trains, its memory is not compared)."""
        if self.error is not None:
            return [f"the trainer raised: {self.error}"]
        if not self.memory_compared:
            return []
        found = []
        projected, difference = self.projected_gib, self.difference
        if projected is not None and projected > self.budget_gib:
            found.append(f"projected peak {projected:.1f} GiB exceeds the {self.budget_gib:.1f} GiB budget of "
                         f"{self.case.instance.name}")
        if difference is not None and abs(difference) > tolerance:
            found.append(f"dry run {self.measured.total if self.measured else 0:.1f} GiB is {difference:+.1%} from "
                         f"the planner's {self.predicted.total:.1f} GiB (tolerance {tolerance:.0%})")
        return found

    def as_json(self, tolerance: float) -> dict[str, Any]:
        return {
            "profile": self.case.name,
            "label": self.case.label,
            "instance_type": self.case.instance.name,
            "nodes": self.case.nodes,
            "world_size": self.case.world_size,
            "knobs": self.case.knobs.model_dump(),
            "executed_knobs": self.case.executed_knobs.model_dump(),
            "dry_run_gib": self.measured.as_json() if self.measured else None,
            "predicted_gib": self.predicted.as_json() | {"peak_phase": self.predicted.peak_phase},
            "planned_gib": self.planned.as_json(),
            "difference": round(self.difference, 4) if self.difference is not None else None,
            "projected_gib": round(self.projected_gib, 2) if self.projected_gib is not None else None,
            "budget_gib": round(self.budget_gib, 2),
            "error": self.error,
            "problems": self.problems(tolerance),
            "seconds": round(self.seconds, 1),
        }


@contextmanager
def fake_process_group(world_size: int) -> Iterator[None]:
    """A process group of ``world_size`` ranks in this process, this process rank 0; collectives do nothing."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise BtkError("a process group is already initialised: run the dry run in its own process")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


@contextmanager
def fake_tensors(fake: bool) -> Iterator[None]:
    """``FakeTensorMode`` (nothing, for a run with real tensors), with every ``DeviceMesh`` built outside it.

    The trainer's data loader makes real token tensors from numpy, which the mode turns into fake
    ones. A device mesh is host bookkeeping (which rank sits where, as an integer tensor); FSDP2
    builds one per tensor-parallel parameter (``DeviceMesh._concatenate`` of the data-parallel
    and tensor-parallel meshes), and under the fake mode the rank lookup in that tensor
    (``nonzero``) has no shape to fake.
    """
    if not fake:
        yield
        return
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    original = DeviceMesh.__init__

    def build_outside_fake_mode(mesh: DeviceMesh, *args: Any, **kwargs: Any) -> None:
        with unset_fake_temporarily():
            original(mesh, *args, **kwargs)

    DeviceMesh.__init__ = build_outside_fake_mode  # type: ignore[method-assign,assignment]
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            yield
    finally:
        DeviceMesh.__init__ = original  # type: ignore[method-assign]


@contextmanager
def attention_as_a_gpu_keeps_it() -> Iterator[None]:
    """Soft-capped attention through SDPA, as :class:`~btk_trainer.model.Attention` documents, for the block."""
    previous = Attention.exact_soft_capping_off_cuda
    Attention.exact_soft_capping_off_cuda = False
    try:
        yield
    finally:
        Attention.exact_soft_capping_off_cuda = previous


def run_steps(case: DryRunCase, *, fake: bool = True) -> MeasuredMemory:
    """Build the model as the trainer does, prime the optimizer's state and train one steady-state step as rank 0
    under the tracker; the step's peak by category.

    ``fake=False`` runs the same with real tensors on the CPU (the tracker's validation: small models only).
    """
    from btk_trainer.train import Placement, RunConfig, build_data, build_model, build_optimizer

    spec = case.spec()
    knobs = spec.knobs
    capability = case.instance.gpu.compute_capability  # what the trainer's precision checks read on the GPU
    with fake_process_group(case.world_size), attention_as_a_gpu_keeps_it():
        shape = mesh_shape(case.world_size, case.nodes, knobs)
        mesh = build_mesh(shape, "cpu")  # outside the fake mode: the mesh holds real rank tensors
        with fake_tensors(fake):
            config = RunConfig(spec=spec, nnodes=case.nodes, device="cpu", param_dtype="bfloat16", compile=False,
                               capability=capability)
            placement = Placement(device=torch.device("cpu"), capability=capability, local_rank=0, rank=0,
                                  world=case.world_size)
            model = build_model(config, spec, placement, mesh, shape)
            if case.whole_logits:
                model.loss_fn = functools.partial(eager_cross_entropy,
                                                  softcap=case.architecture.final_logit_softcapping)
            optimizer = build_optimizer(model, spec.training, on_gpu=True)
            dp_rank, dp_size = data_parallel_rank(mesh)
            windows, sampler = build_data(config, spec, dp_rank, dp_size)
            prime_optimizer_state(model, optimizer, spec)
            tracker = PeakTracker(model, optimizer)  # counts the primed gradients and moments from the start
            gc.collect()
            gc.disable()  # as the trainer trains: cyclic garbage waits for a collection between steps
            try:
                with tracker:
                    # After the tracker's set-up, which cannot read a parameter carrying a precomputed scale.
                    precompute_float8_scales(model, knobs.precision, shape)
                    train_step(model, optimizer, windows, sampler, spec, shape,
                               accumulating=knobs.gradient_accumulation_steps > 1)
            finally:
                gc.enable()
            return without_the_cpus_dense_mask(tracker.measured(), knobs, spec.training.document_masking,
                                               case.architecture)


def dense_mask_gib(knobs: TrainingKnobs, documents: bool = False, arch: ModelArchitecture | None = None) -> float:
    """GiB of the dense additive masks the CPU attends through, bf16, built once per micro-batch and attention kind:
    under context parallelism this rank's positions by the whole sequence, one for the micro-batch (causal) or one
    per sequence (``documents``: ``train.document_masking``); with document masking alone each sequence's positions
    by themselves. A GPU attends through a flex_attention block mask of kilobytes instead; plain causal
    attention without context parallelism needs no mask, and a windowed block of ``arch`` (Gemma) always one."""
    windows = {None} if arch is None else {arch.window(index) for index in range(arch.num_layers)}
    masks = sum(1 for window in windows if window is not None or knobs.context_parallel > 1 or documents)
    sequences = knobs.micro_batch_size if documents else 1
    return masks * sequences * knobs.seq_len // knobs.context_parallel * knobs.seq_len * 2 / GIB


def without_the_cpus_dense_mask(measured: MeasuredMemory, knobs: TrainingKnobs, documents: bool = False,
                                arch: ModelArchitecture | None = None) -> MeasuredMemory:
    """``measured`` less the CPU's dense masks (:func:`dense_mask_gib`), held from the forward to the end of the
    backward: the memory a GPU would hold. Counted among the activations (made before the first block)."""
    mask = dense_mask_gib(knobs, documents, arch)
    if mask == 0.0 or measured.phase == "optimizer" or measured.activations < mask:
        return measured
    return replace(measured, activations=measured.activations - mask, total=measured.total - mask)


def prime_optimizer_state(model: Decoder, optimizer: torch.optim.Optimizer, spec: JobHyperparameters) -> None:
    """The state a first step leaves, without its forward and backward: the gradients FSDP2's reduce-scatter
    assigns (zeros: one buffer per parameter group, each parameter's shard padded as the collective pads it, a
    view of it per parameter), then the trainer's optimizer update, which creates the AdamW moments."""
    for _, _, group in _fsdp_states(model):
        params = group.fsdp_params
        padded = [param.padded_sharded_param_size.numel() for param in params]
        buffer = torch.zeros(sum(padded), dtype=params[0].sharded_param.dtype)
        offset = 0
        for param, size in zip(params, padded, strict=True):
            view = torch.as_strided(buffer, size=param.sharded_size, stride=param.contiguous_sharded_stride,
                                    storage_offset=offset)
            param.sharded_param.grad = param.to_sharded_dtensor(view)
            offset += size
    missing = [name for name, parameter in model.named_parameters() if parameter.grad is None]
    if missing:
        raise RuntimeError(f"parameters outside FSDP2's groups: {', '.join(missing[:3])}")
    optimizer_update(model, optimizer, spec)


def precompute_float8_scales(model: Decoder, precision: str, shape: Any) -> None:
    """Under float8 all-gather, the scales the trainer precomputes after each optimizer step."""
    if float8_all_gather_enabled(precision, shape):
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

        precompute_float8_dynamic_scale_for_fsdp(model)


def train_step(model: Decoder, optimizer: torch.optim.Optimizer, windows: Any, sampler: Any,
               spec: JobHyperparameters, shape: Any, *, accumulating: bool) -> None:
    """One optimizer step of one micro-batch, as :meth:`btk_trainer.train.Trainer.train_step` takes its steps:
    the trainer's micro-batch loop, :func:`optimizer_update`, float8 scales for FSDP's float8 all-gather.

    ``accumulating``: the micro-batch runs as a later micro-batch of an accumulating step does, with an
    earlier micro-batch's gradients resident (here the primed ones, not zeroed).
    """
    from btk_trainer.train import forward_backward

    if not accumulating:
        optimizer.zero_grad(set_to_none=True)
    forward_backward(model, windows, sampler, torch.device("cpu"), 1, defer_all_reduce=shape.dp_replicate > 1,
                     context=lambda: train_context(shape), mask_documents=spec.training.document_masking)
    optimizer_update(model, optimizer, spec)
    precompute_float8_scales(model, spec.knobs.precision, shape)


def optimizer_update(model: Decoder, optimizer: torch.optim.Optimizer, spec: JobHyperparameters) -> None:
    """The trainer's update after a step's backward: clipping, the fused AdamW step with its ``found_inf`` flag."""
    from btk_trainer.train import clip_grad_norm

    clip_grad_norm(list(model.parameters()), spec.training.max_grad_norm)
    fused: Any = optimizer
    fused.found_inf = torch.zeros(())
    try:
        optimizer.step()
    finally:
        del fused.found_inf


EMULATED_PRECISIONS = ("mxfp8",)
"""Precisions the CPU runs in torchao's emulation: it saves the same bf16 inputs and weights as the Blackwell
kernels, but allocates temporaries of its own in backward (26 GiB on Llama 3.2 1B at micro-batch 16 with
selective checkpointing), so a plan in them is built and trained, its memory not compared with the planner's."""

EMULATED_ON_CPU = ("aten::_scaled_mm", "aten::mm")
"""Operators whose CPU kernels allocate working memory a GPU's do not: torch's CPU ``_scaled_mm`` converts its
float8 operands to a wider type inside the call, where cuBLASLt multiplies float8 directly; on CPUs with AMX
(oneDNN's bf16 kernels) ``mm`` packs an operand into a buffer it frees before returning (some 10 KB in a toy's
tensor-parallel step), where cuBLAS works in a workspace it holds once per handle."""


def cpu_allocator_peak(case: DryRunCase) -> tuple[float, MeasuredMemory]:
    """The tracker checked against the CPU allocator: ``case`` with real tensors under ``torch.profiler``.

    Returns the allocator's peak in GiB over the blocks allocated since the model was built (a
    block allocated earlier and freed during the run does not count) and the tracker's figures
    for the same run. A block an operator of :data:`EMULATED_ON_CPU` allocates and frees inside
    one call is left out. Small models only: the tensors are real.
    """
    import json
    import tempfile
    from pathlib import Path

    from torch.profiler import ProfilerActivity, profile

    gc.collect()  # an earlier run's garbage is not this run's
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        measured = run_steps(case, fake=False)
    with tempfile.TemporaryDirectory() as directory:
        trace = Path(directory) / "trace.json"
        profiler.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    calls = [(event["ts"], event["ts"] + event["dur"]) for event in events
             if event.get("name") in EMULATED_ON_CPU and event.get("ph") == "X"]
    blocks = sorted(((event["ts"], event["args"]["Addr"], event["args"]["Bytes"]) for event in events
                     if event.get("name") == "[memory]"), key=lambda block: block[0])

    def call_at(when: float) -> tuple[float, float] | None:
        return next((call for call in calls if call[0] <= when <= call[1]), None)

    counted = [True] * len(blocks)
    allocation_of: dict[int, int] = {}  # address -> index of the block's allocation, while it is alive
    for index, (when, address, size) in enumerate(blocks):
        if size > 0:
            allocation_of[address] = index
        elif address not in allocation_of:
            counted[index] = False  # allocated before the run
        else:
            allocation = allocation_of.pop(address)
            call = call_at(when)
            if call is not None and call == call_at(blocks[allocation][0]):  # an emulated kernel's temporary
                counted[index] = counted[allocation] = False
    current = peak = 0
    for (_, _, size), count in zip(blocks, counted, strict=True):
        if count:
            current += size
            peak = max(peak, current)
    return peak / GIB, measured


def error_line(error: BaseException) -> str:
    """An exception as one line: its type (unless a BtkError, already worded for users) and first line."""
    lines = str(error).strip().splitlines()
    message = printable(lines[0] if lines else "")
    return message if isinstance(error, BtkError) else f"{type(error).__name__}: {message}"


def dry_run(case: DryRunCase, *, fake: bool = True, reraise: bool = False) -> DryRunResult:
    """Run ``case`` and set its peak beside the planner's; whatever the trainer's code raises is the case's error
    (``reraise``: it propagates, with its traceback)."""
    started = time.perf_counter()
    measured: MeasuredMemory | None = None
    error: str | None = None
    try:
        measured = run_steps(case, fake=fake)
    except Exception as raised:  # any failure of the real code is the finding, reported in one line
        if reraise:
            raise
        error = error_line(raised)
    return _result(case, measured, error, time.perf_counter() - started)


def _result(case: DryRunCase, measured: MeasuredMemory | None, error: str | None, seconds: float) -> DryRunResult:
    return DryRunResult(
        case=case,
        predicted=case.predict(case.executed_knobs),
        planned=case.predict(case.knobs),
        budget_gib=memory_budget_gib(case.instance),
        measured=measured,
        error=error,
        seconds=seconds,
    )


def trainer_view(case: DryRunCase) -> str:
    """Everything of ``case`` the trainer's code reads: cases with the same view run the same tensors.

    The instance type is read for its GPUs per node and, through the precision check alone, its compute
    capability (:func:`~btk_trainer.parallelize.check_precision`): the same plan on B200 and B300 trains the
    same step, only the budget it is held to differs.
    """
    try:
        check_precision(case.knobs.precision, case.instance.gpu.compute_capability)
        precision = "allowed"
    except BtkError as refused:
        precision = str(refused)
    return "|".join((case.name, case.architecture.model_dump_json(), case.training.model_dump_json(),
                     case.knobs.model_dump_json(), str(case.instance.gpus_per_node), str(case.nodes),
                     str(case.whole_logits), precision))


def dry_run_all(cases: Sequence[DryRunCase], jobs: int = 1) -> list[DryRunResult]:
    """Each case's :func:`dry_run`, in order; ``jobs`` > 1 runs them in that many processes at once.

    Cases the trainer sees alike (:func:`trainer_view`) run once; each gets the measured step beside its own
    planner figures and budget. A dry run keeps one core busy (fake tensors carry no arithmetic; building and
    dispatching is Python), so a machine's cores run as many cases side by side. The processes are spawned (a
    fresh interpreter: no process group, fake mode or allocator state of this one carries over).
    """
    views: dict[str, DryRunCase] = {}
    for case in cases:
        views.setdefault(trainer_view(case), case)
    distinct = list(views.values())
    if jobs <= 1 or len(distinct) <= 1:
        ran = [dry_run(case) for case in distinct]
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=min(jobs, len(distinct)),
                                 mp_context=multiprocessing.get_context("spawn")) as pool:
            ran = list(pool.map(dry_run, distinct))
    by_view = {trainer_view(result.case): result for result in ran}
    return [result if result.case is case else _result(case, result.measured, result.error, result.seconds)
            for case in cases for result in (by_view[trainer_view(case)],)]


def profile_case(profile: ModelProfile, instance: InstanceType, nodes: int, settings: dict[str, str] | None = None,
                 *, baseline: bool = False) -> DryRunCase:
    """The planner's knobs for ``profile`` (its legacy baseline with ``baseline``), with ``settings`` over them; a
    ``seq_len`` among them is planned for, as ``btk plan --set seq_len=N`` plans (the global batch in tokens kept)."""
    if settings and "seq_len" in settings:
        profile = with_settings(profile, {"seq_len": settings["seq_len"]})
    plan = plan_profile(profile, instance, nodes)
    knobs, label = plan.knobs, "plan"
    if baseline:
        if plan.baseline is None:
            raise BtkError(f"{profile.name} on {nodes} x {instance.name} has no legacy baseline that fits")
        knobs, label = plan.baseline.knobs, "baseline"
    if settings:
        knobs, label = parse_knobs({**knobs.model_dump(), **settings}), "--set"
    return DryRunCase(name=profile.name, architecture=profile.architecture, training=profile.training,
                      instance=instance, nodes=nodes, knobs=knobs, label=label)


def shipped_cases() -> list[DryRunCase]:
    """Every profile of every environment at its planned instance type, nodes and knobs (each once), and the
    legacy baseline of the first of them."""
    cases: list[DryRunCase] = []
    seen: set[tuple[str, str, int]] = set()
    for environment in all_environments().values():
        instance = get_instance_type(environment.instance_type)
        for name in environment.profiles:
            key = (name, instance.name, environment.instance_count)
            if key not in seen:
                seen.add(key)
                cases.append(profile_case(get_profile(name), instance, environment.instance_count))
    if cases:
        first = cases[0]
        cases.append(profile_case(get_profile(first.name), first.instance, first.nodes, baseline=True))
    return cases


def _knobs_text(knobs: TrainingKnobs) -> str:
    return (f"mb={knobs.micro_batch_size} ga={knobs.gradient_accumulation_steps} seq={knobs.seq_len} "
            f"{knobs.precision} ac={knobs.activation_checkpointing} {knobs.sharding} tp={knobs.tensor_parallel}"
            f"{context_parallel_suffix(knobs)}")


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def result_table(tolerance: float) -> Table[DryRunResult]:
    """One row per case: the eager knobs' prediction beside the dry run, then the plan's projection."""
    def verdict(result: DryRunResult) -> str:
        if not result.problems(tolerance) and not result.memory_compared:
            return f"ok ({result.case.knobs.precision} emulated on the CPU: memory not compared)"
        return "; ".join(result.problems(tolerance)) or "ok"

    return Table([
        Column("profile", lambda r: r.case.name if r.case.label == "plan" else f"{r.case.name} ({r.case.label})"),
        Column("instance", lambda r: r.case.instance.name),
        Column("nodes", lambda r: str(r.case.nodes), "right"),
        Column("knobs", lambda r: _knobs_text(r.case.knobs)),
        Column("predicted GiB", lambda r: _gib(r.predicted.total), "right"),
        Column("dry-run GiB", lambda r: _gib(r.measured.total if r.measured else None), "right"),
        Column("difference", lambda r: "-" if r.difference is None else f"{r.difference:+.1%}", "right"),
        Column("planned GiB", lambda r: _gib(r.planned.total), "right"),
        Column("projected GiB", lambda r: _gib(r.projected_gib), "right"),
        Column("budget GiB", lambda r: _gib(r.budget_gib), "right"),
        Column("result", verdict),
    ])


def category_table() -> Table[tuple[str, float, float]]:
    """One case's peak by category: (category, predicted GiB, dry-run GiB)."""
    return Table([
        Column("category", lambda row: row[0]),
        Column("predicted GiB", lambda row: f"{row[1]:.2f}", "right"),
        Column("dry-run GiB", lambda row: f"{row[2]:.2f}", "right"),
    ])


def category_rows(result: DryRunResult) -> list[tuple[str, float, float]]:
    """The planner's categories beside the tracker's: activations and logits together (the tracker cannot tell
    them apart), FSDP's in-flight buffers as the planner's ``other``."""
    if result.measured is None:
        return []
    predicted, measured = result.predicted, result.measured
    return [
        ("parameters", predicted.parameters, measured.parameters),
        ("gradients", predicted.gradients, measured.gradients),
        ("optimizer", predicted.optimizer, measured.optimizer),
        ("activations + logits", predicted.activations + predicted.logits, measured.activations + measured.temporaries),
        ("in flight (other)", predicted.other, measured.in_flight),
        ("total", predicted.total, measured.total),
    ]


@dataclass
class Report:
    """The results of one invocation, printed as the chosen format."""

    results: list[DryRunResult] = field(default_factory=list)
    tolerance: float = DEFAULT_TOLERANCE

    def text(self, markdown: bool) -> list[str]:
        table = result_table(self.tolerance)
        lines = table.markdown(self.results) if markdown else table.text(self.results)
        if len(self.results) == 1 and self.results[0].measured is not None:
            result = self.results[0]
            rows = category_rows(result)
            lines += ["", f"peak by category (dry run peak in {result.measured.phase if result.measured else '-'}, "
                          f"predicted peak at {result.predicted.peak_phase}):"]
            lines += category_table().markdown(rows) if markdown else category_table().text(rows)
        return lines

    @property
    def failed(self) -> bool:
        return any(result.problems(self.tolerance) for result in self.results)


MAX_JOBS = 64


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m btk_trainer.dryrun", description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--profile", help="a profile of profiles/ (with --env, or --instance-type and --nodes)")
    what.add_argument("--shipped", action="store_true",
                      help="every profile of every environment at its plan, and the first one's legacy baseline")
    parser.add_argument("--env", help="the environment whose instance type and node count to use (alone: all of "
                                      "its profiles)")
    parser.add_argument("--instance-type", help="instance type (instead of --env)")
    parser.add_argument("--nodes", type=int, default=None,
                        help=f"node count, 1 to {max_nodes()} (default: the environment's, else 1)")
    parser.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE",
                        help="a knob over the plan's, e.g. --set micro_batch_size=8 (repeatable)")
    parser.add_argument("--baseline", action="store_true", help="the planner's legacy baseline instead of its plan")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                        help=f"largest accepted |dry run / prediction - 1| (default {DEFAULT_TOLERANCE})")
    parser.add_argument("--format", choices=("table", "markdown", "json"), default="table", dest="output_format")
    parser.add_argument("--jobs", type=int, default=1,
                        help="cases run side by side in that many processes (default 1; one core each)")
    parser.add_argument("--traceback", action="store_true", help="let the trainer's exception propagate (debugging)")
    return parser.parse_args(argv)


def cases_from_args(args: argparse.Namespace) -> list[DryRunCase]:
    """The cases the command line names; one-line errors for bad input."""
    if not 1 <= args.jobs <= MAX_JOBS:
        raise BtkError(f"--jobs {args.jobs}: a whole number from 1 to {MAX_JOBS}")
    if args.jobs > 1 and args.traceback:
        raise BtkError("--traceback runs the cases one by one: drop --jobs")
    if args.shipped:
        if not 0 < args.tolerance < 1:
            raise BtkError(f"--tolerance {args.tolerance}: a fraction between 0 and 1, e.g. 0.1")
        if args.env or args.instance_type or args.set or args.baseline or args.nodes is not None:
            raise BtkError("--shipped takes no --env, --instance-type, --nodes, --set or --baseline")
        return shipped_cases()
    if not 0 < args.tolerance < 1:
        raise BtkError(f"--tolerance {args.tolerance}: a fraction between 0 and 1, e.g. 0.1")
    settings = parse_settings(args.set)
    if args.profile is None and args.env is None:
        raise BtkError("name a --profile, an --env, or --shipped")
    if args.env is not None and args.instance_type is not None:
        raise BtkError("give --env or --instance-type, not both")
    if args.nodes is not None and not 1 <= args.nodes <= max_nodes():  # btk plan's bound: a job's instance count
        raise BtkError(f"--nodes {args.nodes}: a whole number from 1 to {max_nodes()}")
    if args.env is not None:
        environment = get_environment(args.env)
        instance = get_instance_type(environment.instance_type)
        nodes = args.nodes or environment.instance_count
        names = [args.profile] if args.profile else list(environment.profiles)
    else:
        if args.instance_type is None:
            raise BtkError("name the cluster: --env ENV, or --instance-type TYPE [--nodes N]")
        instance, nodes, names = get_instance_type(args.instance_type), args.nodes or 1, [args.profile]
    return [profile_case(get_profile(name), instance, nodes, settings, baseline=args.baseline) for name in names]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cases = cases_from_args(args)
    except BtkError as error:
        print(f"btk_trainer.dryrun: {printable(str(error))}", file=sys.stderr)
        return 2
    report = Report(tolerance=args.tolerance)
    if args.traceback:
        report.results.extend(dry_run(case, reraise=True) for case in cases)
    else:
        report.results.extend(dry_run_all(cases, args.jobs))
    if args.output_format == "json":
        import json

        print(json.dumps([result.as_json(args.tolerance) for result in report.results], indent=2))
    else:
        print("\n".join(report.text(markdown=args.output_format == "markdown")))
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
