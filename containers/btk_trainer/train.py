"""The training loop: one process per GPU, launched by torchrun (see :mod:`btk_trainer.entrypoint`).

    torchrun ... -m btk_trainer.train --hyperparameters hyperparameters.json \\
        --data-dir /opt/ml/input/data/train --checkpoint-dir /opt/ml/checkpoints \\
        --model-dir /opt/ml/model --nnodes 2

Every knob of :class:`~btk.knobs.TrainingKnobs` is honoured (see :mod:`btk_trainer.parallelize`);
the schedule comes from :class:`~btk.profile.TrainingIntent` (warmup + cosine to
``min_learning_rate_ratio * learning_rate``, AdamW, gradient clipping, gradient accumulation).
SIGTERM (SageMaker stop, spot reclaim) or the end of a capacity block
(:mod:`btk_trainer.stopping`) makes every rank stop at the next micro-batch, drop the partial
step, write a checkpoint of the last complete one and exit 0; a restarted job resumes from the
latest complete checkpoint. A step whose loss or gradient norm is not finite is skipped and
counted; more than ``job.max_nonfinite_steps`` of them fail the job with one line.

:class:`Trainer` holds one run as named steps: set up device and mesh, build model,
optimizer and data, resume, then the loop (train step, agree on stopping, log, checkpoint
when :class:`~btk_trainer.checkpoint.Checkpointer` says so). :func:`exit_code` says what the
process's exit status means.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import re
import signal
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule

from btk import hardware
from btk.errors import BtkError
from btk.hyperparameters import JobHyperparameters
from btk.metrics import format_knob_rung_line, format_loss_drop_line, format_metric_line, format_own_line
from btk.planner.stop_save import StopSave
from btk.planner.throughput import model_flops_per_token
from btk.profile import TrainingIntent
from btk.shards import VERIFIED_RECORD_NAME
from btk_trainer.checkpoint import Checkpointer, TrainerState, latest_checkpoint
from btk_trainer.data import Batch, BatchLoader, ResumableSampler, TokenShards, Windows, next_batch
from btk_trainer.exiting import exit_without_finalizing
from btk_trainer.ladder import (
    EXIT_STEP_DOWN,
    LADDER_STATE_ENV,
    RESTART_COUNT_ENV,
    current_rung,
    describe,
    on_rung,
    record_rung,
    resumed_rung,
    rungs,
    step_down,
)
from btk_trainer.launch import load_hyperparameters, report_failure
from btk_trainer.layout import MeshShape, accumulation_for
from btk_trainer.model import Decoder, export_hf, load_safetensors
from btk_trainer.parallelize import (
    build_mesh,
    data_parallel_rank,
    float8_all_gather_enabled,
    mesh_shape,
    parallelize,
    train_context,
)
from btk_trainer.stopping import (
    CAPACITY_BLOCK_SAFETY_MARGIN,
    CAPACITY_BLOCK_TERMINATION_LEAD,
    CapacityBlockValueError,
    StopAgreement,
    StopFlag,
    StopReason,
    capacity_block,
    describe_epoch,
)

GIB = 1024**3
# Stopped by SIGTERM with no checkpoint of the last step (no checkpoint directory): the work is lost,
# so the exit status must not read as success. 128 + SIGTERM, the shell's code for "killed by SIGTERM".
EXIT_STOPPED_UNSAVED = 128 + signal.SIGTERM
# Python's cycle collector is paused during training and run every this many steps (torchtitan's
# GarbageCollection): left alone it starts at random inside a step, and on every rank at a different one.
GC_INTERVAL_STEPS = 50


class SyntheticWindows:
    """Deterministic random token windows (benchmarks and tests without a dataset)."""

    eos_token_id: int | None = None  # random tokens: no documents

    def __init__(self, vocab_size: int, seq_len: int, count: int = 1 << 16, seed: int = 0) -> None:
        self.vocab_size, self.seq_len, self.count, self.seed = vocab_size, seq_len, count, seed

    def __len__(self) -> int:
        return self.count

    def window(self, index: int) -> np.ndarray[Any, Any]:
        return np.random.default_rng([self.seed, index]).integers(0, self.vocab_size, self.seq_len + 1, dtype=np.int64)


@dataclass
class RunConfig:
    """Where a run reads and writes, and the overrides tests and benchmarks use."""

    spec: JobHyperparameters
    data_dir: Path | None = None  # None: synthetic tokens
    checkpoint_dir: Path | None = None  # None: no checkpoints, no resume
    model_dir: Path | None = None  # None: no final export
    nnodes: int = 1
    device: str | None = None  # default: cuda when available
    param_dtype: str | None = None  # "bfloat16" / "float32"; default bf16 on GPU, fp32 on CPU
    compile: bool | None = None  # default: knobs.compile on GPU, off on CPU
    # Compute capability the precision checks see; default: the GPU's, None on CPU. Tests set it
    # on CPU to train fp8_tensorwise/rowwise there (torch emulates _scaled_mm on CPU).
    capability: tuple[int, int] | None = None
    max_steps: int | None = None  # overrides job.max_steps / the token budget
    verify_data: bool = True
    # Called after each optimizer step, before the ranks agree whether to stop: a SIGTERM raised
    # here is acted on at that very step (tests stop runs at exact steps this way).
    on_step_end: Callable[[int], None] | None = None
    # Called before each micro-batch after the first with (step, micro-batch index): tests send
    # SIGTERM here to stop a run in the middle of an optimizer step.
    on_micro_batch: Callable[[int, int], None] | None = None
    return_state: bool = False  # tests: gather the full fp32 weights into RunResult.final_state
    # Benchmarks: time each phase of a step (RunResult.phase_seconds), synchronising the device at every
    # phase boundary, which costs the overlap it measures; off in training.
    time_phases: bool = False


@dataclass
class RunResult:
    """What a run did; tests and the benchmark read it, :func:`exit_code` turns it into an exit status."""

    steps_done: int
    interrupted: bool  # stopped (SIGTERM, capacity block) before the last step
    resumed_from: int | None
    saved_step: int | None = None  # newest checkpoint on disk: written by this run or resumed from
    losses: dict[int, float] = field(default_factory=dict)
    grad_norms: dict[int, float] = field(default_factory=dict)
    final_state: dict[str, torch.Tensor] | None = None
    metrics: list[dict[str, float]] = field(default_factory=list)
    stop_reason: StopReason = field(default_factory=StopReason)
    dropped_step: int | None = None  # the optimizer step a stop cut short (its micro-batches are redone on resume)
    nonfinite_steps: int = 0  # steps skipped for a NaN/inf loss or gradient norm, resumed runs included
    phase_seconds: dict[str, float] = field(default_factory=dict)  # RunConfig.time_phases: seconds per phase
    first_step_seconds: float | None = None  # the trainer's start to its first step's end: set-up and compilation


def exit_code(result: RunResult) -> int:
    """0 when the run finished, or was stopped with its last step checkpointed; else :data:`EXIT_STOPPED_UNSAVED`.

    A SageMaker stop (StopTrainingJob) or a spot reclaim sends SIGTERM; a run that then saved
    cleanly has done what was asked of it (a restarted job resumes there), so it exits 0.
    Errors are non-zero elsewhere: 2 for a one-line user error, 1 for an uncaught exception.
    """
    if result.interrupted and result.steps_done > (result.saved_step or 0):
        return EXIT_STOPPED_UNSAVED
    return 0


def learning_rate(step: int, *, peak: float, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup over ``warmup`` steps, then cosine decay to ``min_ratio * peak`` at ``total``."""
    if warmup and step <= warmup:
        return peak * step / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def total_steps(spec: JobHyperparameters, dp_size: int, override: int | None) -> int:
    if override is not None:
        return override
    if spec.job.max_steps is not None:
        return spec.job.max_steps
    if spec.training.total_tokens is None:
        raise BtkError("set job.max_steps or train.total_tokens: the run needs a length")
    knobs = spec.knobs
    tokens_per_step = knobs.micro_batch_size * knobs.gradient_accumulation_steps * knobs.seq_len * dp_size
    return max(1, spec.training.total_tokens // tokens_per_step)


def _name_words(name: str) -> set[str]:
    return set(re.split(r"[^a-z0-9]+", name.lower())) - {""}


def peak_bf16_tflops(device: torch.device) -> float:
    """Dense bf16 peak of this GPU from the btk hardware catalog; 0 on CPU or an unknown GPU."""
    if device.type != "cuda":
        return 0.0
    words = _name_words(torch.cuda.get_device_name(device))  # e.g. "NVIDIA A100-SXM4-80GB"
    specs = {instance.gpu.name: instance.gpu for instance in hardware.INSTANCE_TYPES.values()}
    specs.update({v.name: v for v in vars(hardware).values() if isinstance(v, hardware.GpuSpec)})
    matches = [spec for spec in specs.values() if _name_words(spec.name) <= words]
    if not matches:
        return 0.0
    best = max(matches, key=lambda spec: len(spec.name))
    return best.peak_tflops("bf16") if best.supports("bf16") else 0.0


def clip_grad_norm(parameters: Sequence[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Clip gradients to a global L2 norm of ``max_norm``; returns the norm before clipping (a plain tensor).

    ``torch.nn.utils.clip_grad_norm_`` stacks the per-parameter norms, which fails when the
    gradients are DTensors on different meshes: with ``tensor_parallel > 1`` the blocks'
    linears live on the (dp_shard, tp) mesh and the norms/embeddings on the dp_shard mesh.
    Here each mesh's norm is reduced over its own mesh first, then the squares are summed.
    """
    from torch.distributed.tensor import DTensor, Replicate

    groups: dict[Any, list[torch.Tensor]] = {}  # gradients by device mesh (None: plain tensors)
    for parameter in parameters:
        grad = parameter.grad
        if grad is not None:
            groups.setdefault(grad.device_mesh if isinstance(grad, DTensor) else None, []).append(grad)
    if not groups:
        return torch.zeros(())
    norms = []
    for grads in groups.values():
        norm = torch.nn.utils.get_total_norm(grads, 2.0, foreach=True)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    total = norms[0] if len(norms) == 1 else torch.stack([n.float() for n in norms]).square().sum().sqrt()
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for mesh, grads in groups.items():
        factor = coefficient if mesh is None else DTensor.from_local(
            coefficient, mesh, [Replicate()] * mesh.ndim, run_check=False)
        torch._foreach_mul_(grads, factor)
    return total


class PhaseTimes:
    """Seconds per phase of the steps (:data:`PHASES`) when given a device to synchronise, else nothing.

    Each phase is bracketed by device synchronisations, so the time is the phase's own work
    plus the communication it waits for; "communication" is the collectives outside forward
    and backward (the stop agreement, the gradient-norm and non-finite reductions).
    """

    PHASES = ("data", "forward", "backward", "communication", "optimizer", "checkpoint")

    def __init__(self, device: torch.device | None) -> None:
        self.device = device
        self.seconds: dict[str, float] = dict.fromkeys(self.PHASES, 0.0) if device is not None else {}

    def _sync(self) -> None:
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.device is None:
            yield
            return
        self._sync()
        started = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.seconds[name] += time.perf_counter() - started

    def add(self, name: str, seconds: float) -> None:
        if self.device is not None:
            self.seconds[name] += seconds


def forward_backward(
    model: Decoder, windows: Windows, sampler: ResumableSampler, device: torch.device, accumulation: int,
    *, defer_all_reduce: bool = False, stop_agreed: Callable[[int], bool] | None = None,
    phases: PhaseTimes | None = None, context: Callable[[], AbstractContextManager[Any]] = nullcontext,
    batches: Callable[[], Batch] | None = None, mask_documents: bool = False,
) -> torch.Tensor | None:
    """One optimizer step's gradients: ``accumulation`` micro-batches, loss scaled by 1/accumulation.

    ``defer_all_reduce`` (replicated mesh dim: ``hybrid_shard`` across nodes, ``no_shard``):
    FSDP2 still reduce-scatters every micro-batch inside the shard group but all-reduces across
    the replicas only after the last one, instead of crossing the inter-node network every time.
    ``stop_agreed(micro)`` is asked before every micro-batch after the first (collective: every
    rank asks at the same one); when it says stop, the step is abandoned and None returned.
    ``context`` makes what each micro-batch's forward and backward run under
    (:func:`~btk_trainer.parallelize.train_context`: ``loss_parallel()`` with tensor parallelism).
    ``batches`` gives the next micro-batch (the trainer's :class:`~btk_trainer.data.BatchLoader`,
    reading ahead); by default each one is read when needed. ``mask_documents``
    (``train.document_masking``): each token attends within its own document only.
    Returns this rank's summed (scaled) loss as a detached tensor.
    """
    timer = phases or PhaseTimes(None)
    loss_sum = torch.zeros((), device=device)
    for micro in range(accumulation):
        if micro and stop_agreed is not None and stop_agreed(micro):
            if defer_all_reduce:
                cast(FSDPModule, model).set_requires_all_reduce(True)
            return None
        if defer_all_reduce:
            cast(FSDPModule, model).set_requires_all_reduce(micro == accumulation - 1)
        with timer.phase("data"):
            batch = batches() if batches is not None else next_batch(windows, sampler, device)
        with context():
            with timer.phase("forward"):
                loss = model(batch.inputs, batch.targets, batch.documents if mask_documents else None) / accumulation
            with timer.phase("backward"):
                loss.backward()
        loss_sum += loss.detach()
    return loss_sum


def load_pretrained(model: Decoder, directory: Path) -> None:
    """Load a Hugging Face safetensors checkpoint into the (sharded) model; rank 0 reads the files."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    full: dict[str, Any] = {}
    if dist.get_rank() == 0:
        with torch.device("meta"):
            reference = Decoder(model.arch)
        reference.to_empty(device="cpu")
        reference.tie_weights()
        load_safetensors(reference, directory)
        full = reference.state_dict()
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))


def setup_distributed(device: torch.device, timeout_minutes: int) -> None:
    """Join the process group; on CUDA bound to this rank's GPU (eager NCCL init, correct barriers).

    ``timeout_minutes`` bounds every collective wait: rank 0 alone reads a pretrained
    checkpoint and writes the final model while the other ranks wait in one.
    """
    if dist.is_initialized():
        return
    timeout = timedelta(minutes=timeout_minutes)
    backend: dict[str, Any] = {"backend": "nccl", "device_id": device} if device.type == "cuda" else {"backend": "gloo"}
    dist.init_process_group(**backend, timeout=timeout, **attempt_store(timeout))


def attempt_store(timeout: timedelta) -> dict[str, Any]:
    """``init_process_group``'s store arguments for a torchrun restart; none for the first attempt (``env://``).

    torchrun's static rendezvous keeps one store for every attempt of a job, so the processes of a
    restart (a knob-ladder step, :mod:`btk_trainer.ladder`) would find the previous attempt's keys
    in it: the process group's peer addresses of processes that are gone, and a connection to them
    is refused. Each restart therefore keys its process group under a prefix of its own.
    """
    from torch._C._distributed_c10d import PrefixStore, TCPStore  # the classes torch.distributed re-exports

    restart = int(os.environ.get(RESTART_COUNT_ENV) or 0)
    if restart == 0:
        return {}
    store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" and
                          os.environ.get("RANK") == "0", timeout=timeout)
    return {"store": PrefixStore(f"btk/attempt-{restart}", store), "rank": int(os.environ["RANK"]),
            "world_size": int(os.environ["WORLD_SIZE"])}


@dataclass(frozen=True)
class Placement:
    """Where this process trains: its device, its ranks, and the compute capability precision checks see."""

    device: torch.device
    capability: tuple[int, int] | None
    local_rank: int
    rank: int
    world: int

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"


def set_up_device(config: RunConfig) -> Placement:
    """Pick this rank's device, then join the process group on it."""
    device_type = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
    # The GPU is chosen before the process group exists, so NCCL binds to it (not to GPU 0).
    local_rank = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))  # torchrun sets both
    capability: tuple[int, int] | None = None
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        capability = torch.cuda.get_device_capability(device)
    else:
        device = torch.device("cpu")
    setup_distributed(device, config.spec.job.collective_timeout_minutes)
    rank = dist.get_rank()
    if "LOCAL_RANK" not in os.environ and device_type != "cuda":
        local_rank = rank
    return Placement(device=device, capability=config.capability or capability, local_rank=local_rank,
                     rank=rank, world=dist.get_world_size())


def rescale_accumulation(spec: JobHyperparameters, dp_size: int, *, announce: bool) -> JobHyperparameters:
    """The spec with ``gradient_accumulation_steps`` changed so the planned global batch survives ``dp_size``."""
    knobs = spec.knobs
    accumulation = accumulation_for(knobs, spec.job.planned_data_parallel, dp_size)
    if not accumulation.rescaled:
        return spec
    if announce:
        print(
            f"btk: {dp_size} data-parallel ranks, knobs planned for {spec.job.planned_data_parallel}: "
            f"gradient_accumulation_steps={accumulation.steps} keeps the global batch at "
            f"{accumulation.global_batch} sequences (planned {accumulation.planned_global_batch})",
            flush=True,
        )
    knobs = knobs.model_copy(update={"gradient_accumulation_steps": accumulation.steps})
    return spec.model_copy(update={"knobs": knobs})


def build_model(config: RunConfig, spec: JobHyperparameters, placement: Placement, mesh: DeviceMesh,
                shape: MeshShape) -> Decoder:
    """Build on the meta device, apply every knob (:func:`parallelize`), materialise, then initialise or load."""
    knobs, on_gpu = spec.knobs, placement.on_gpu
    param_dtype = getattr(torch, config.param_dtype or ("bfloat16" if on_gpu else "float32"))
    with torch.device("meta"):
        model = Decoder(spec.architecture)
    parallelize(
        model, knobs, mesh, shape,
        param_dtype=None if param_dtype == torch.float32 else param_dtype,
        capability=placement.capability,
        compile_enabled=(knobs.compile if on_gpu else False) if config.compile is None else config.compile,
        fused_loss_enabled=knobs.fused_loss and on_gpu,
        emulate_mxfp8=not on_gpu,  # torchao's MXFP8 kernels need a Blackwell GPU; CPU tests emulate them
        async_tensor_parallel=spec.job.async_tensor_parallel,
    )
    model.to_empty(device=placement.device)
    if spec.architecture.tied_embeddings and not model.weights_tied:  # FSDP2 swaps tensors in place
        raise RuntimeError("tied embeddings were untied while materialising the model")
    if spec.job.init_from:
        load_pretrained(model, Path(spec.job.init_from))
    else:
        model.init_weights(spec.job.seed)
    return model


def build_optimizer(model: Decoder, intent: TrainingIntent, *, on_gpu: bool) -> torch.optim.Optimizer:
    """Fused AdamW, no weight decay on norms and biases (the 1-D parameters).

    Fused on every device: its kernel takes ``found_inf``, which is how a non-finite step is
    skipped without the host reading a flag from the GPU (:meth:`Trainer.train_step`).
    """
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": intent.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=intent.learning_rate, betas=(0.9, 0.95), eps=1e-8, fused=True,
    )


def build_data(config: RunConfig, spec: JobHyperparameters, dp_rank: int, dp_size: int) -> tuple[
        Windows, ResumableSampler]:
    """The token windows (shards, or synthetic without a data directory) and this rank's sampler over them."""
    knobs = spec.knobs
    windows: Windows
    if config.data_dir is None:
        windows = SyntheticWindows(spec.architecture.vocab_size, knobs.seq_len, seed=spec.job.seed)
    else:
        record = config.checkpoint_dir / VERIFIED_RECORD_NAME if config.checkpoint_dir is not None else None
        windows = TokenShards(config.data_dir, knobs.seq_len, verify="ranks" if config.verify_data else "none",
                              record=record)
        vocab = windows.manifest.vocab_size
        if vocab > spec.architecture.vocab_size:
            raise BtkError(f"dataset vocab_size {vocab} exceeds arch.vocab_size {spec.architecture.vocab_size}")
    sampler = ResumableSampler(len(windows), micro_batch_size=knobs.micro_batch_size, dp_rank=dp_rank,
                               dp_size=dp_size, seed=spec.job.seed)
    return windows, sampler


class ThroughputWindow:
    """Wall time and steps since the last metric line; time spent saving checkpoints is left out."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.started, self.steps = time.perf_counter(), 0

    def count_step(self) -> None:
        self.steps += 1

    def seconds(self) -> float:
        return time.perf_counter() - self.started

    @contextmanager
    def paused(self) -> Iterator[None]:
        paused_at = time.perf_counter()
        try:
            yield
        finally:
            self.started += time.perf_counter() - paused_at


class Trainer:
    """One run: the set-up steps in :meth:`__init__`, then :meth:`train` (torchtitan's ``Trainer`` shape)."""

    def __init__(self, config: RunConfig) -> None:
        self.started = time.perf_counter()
        self.first_step_seconds: float | None = None  # from here to the end of this run's first step
        self.config = config
        self.placement = set_up_device(config)
        self.shape = mesh_shape(self.placement.world, config.nnodes, config.spec.knobs)
        self.mesh = build_mesh(self.shape, self.placement.device.type)
        self.dp_rank, self.dp_size = data_parallel_rank(self.mesh)
        self.spec = rescale_accumulation(config.spec, self.dp_size, announce=self.is_logger)
        self.total_steps = total_steps(self.spec, self.dp_size, config.max_steps)
        torch.manual_seed(self.spec.job.seed)
        self.model = build_model(config, self.spec, self.placement, self.mesh, self.shape)
        self.optimizer = build_optimizer(self.model, self.spec.training, on_gpu=self.placement.on_gpu)
        self.windows, self.sampler = build_data(config, self.spec, self.dp_rank, self.dp_size)
        self.state = TrainerState(self.sampler)
        self.loader = BatchLoader(self.windows, self.sampler, self.placement.device)
        self.documents_told = False  # the first metric line is followed by how documents share the windows
        self.checkpointer = Checkpointer(
            config.checkpoint_dir, model=self.model, optimizer=self.optimizer, state=self.state,
            interval=self.spec.job.checkpoint_interval_steps, keep=self.spec.job.keep_last_checkpoints,
            local_rank=self.placement.local_rank,
            local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),  # torchrun sets it
        )
        self.resumed_from = self.resume()
        # One all-reduce for every fp8 weight's scale after each step, not one per weight.
        self.precompute_float8_scales = float8_all_gather_enabled(self.spec.knobs.precision, self.shape)
        knobs = self.spec.knobs
        self.tokens_per_gpu_step = (knobs.micro_batch_size * knobs.gradient_accumulation_steps * knobs.seq_len
                                    * self.dp_size / self.placement.world)
        self.flops_per_token = model_flops_per_token(self.spec.architecture, knobs.seq_len)
        self.peak_tflops = peak_bf16_tflops(self.placement.device)
        self.window = ThroughputWindow()
        self.stop_agreement = StopAgreement(self.placement.device)
        self.deadline = self.read_capacity_block()
        self.unread: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.phases = PhaseTimes(self.placement.device if config.time_phases else None)

    @property
    def is_logger(self) -> bool:
        return self.placement.rank == 0

    def read_capacity_block(self) -> float | None:
        """The stop deadline of a job on a training plan (None otherwise); rank 0 says how it read it."""
        try:
            block = capacity_block(os.environ)
        except CapacityBlockValueError as error:
            if self.is_logger:
                print(f"btk: warning: {error}; the run will not stop by itself before its capacity ends", flush=True)
            return None
        if block is not None and self.is_logger:
            print(block.line(), flush=True)
        return block.deadline if block is not None else None

    def resume(self) -> int | None:
        """Continue from the newest checkpoint every rank has, if any; the step it holds."""
        path = self.checkpointer.resume()
        if path is None:
            return None
        if self.is_logger:
            print(f"btk: resumed from {path} (step {self.state.step})", flush=True)
        return self.state.step

    def train(self) -> RunResult:
        """Step until the last step or an agreed stop; export the model after the last one."""
        result = RunResult(steps_done=self.state.step, interrupted=False, resumed_from=self.resumed_from)
        if self.placement.on_gpu:
            torch.cuda.reset_peak_memory_stats(self.placement.device)
        self.window.reset()
        gc.disable()
        try:
            self.loop(result)
        finally:
            gc.enable()
            self.loader.close()
        result.saved_step = self.checkpointer.last_saved
        result.nonfinite_steps = self.state.nonfinite_steps
        result.phase_seconds = dict(self.phases.seconds)
        result.first_step_seconds = self.first_step_seconds
        if result.interrupted:
            self.announce_stop(result)
        else:
            self.finish(result)
        return result

    def loop(self, result: RunResult) -> None:
        """The steps, with the host reading device values only on logging and checkpoint steps."""
        with StopFlag(self.deadline) as flag:
            while self.state.step < self.total_steps and not result.interrupted:
                step = self.state.step + 1
                if step % GC_INTERVAL_STEPS == 0:
                    gc.collect(1)
                outcome = self.train_step(step, flag, result)
                if outcome is None:  # stopped between micro-batches: the partial step is dropped
                    result.interrupted, result.dropped_step = True, step
                else:
                    self.state.step = result.steps_done = step
                    loss_sum, grad_norm, skipped = outcome
                    if self.first_step_seconds is None:  # once: the host waits for the device's first step
                        if self.placement.on_gpu:
                            torch.cuda.synchronize(self.placement.device)
                        self.first_step_seconds = time.perf_counter() - self.started
                    self.unread.append((step, loss_sum, grad_norm, skipped))
                    self.window.count_step()
                    if self.config.on_step_end is not None:
                        self.config.on_step_end(step)
                    with self.phases.phase("communication"):
                        result.stop_reason = self.stop_agreement.agree(flag)
                    result.interrupted = result.stop_reason.any
                    if step % self.spec.job.log_interval_steps == 0 or step == self.total_steps or result.interrupted:
                        self.read_steps(result)
                        self.log(step, loss_sum, result)
                if self.state.step and self.checkpointer.should_save(self.state.step,
                                                                     stop_requested=result.interrupted):
                    self.read_steps(result)  # the checkpoint holds the settled non-finite count
                    self.save(stop=flag if result.interrupted else None)
            self.read_steps(result)
            self.stop_agreement.close()
            self.checkpointer.close()

    def save(self, *, stop: StopFlag | None = None) -> None:
        """Checkpoint the current state; rank 0 says how long the loop was held (stops have a deadline).

        ``stop`` (SIGTERM or the capacity deadline): written before returning, unless its measured
        duration says it cannot finish by the stop's deadline
        (:meth:`btk_trainer.checkpoint.Checkpointer.save_for_stop`); otherwise the loop pays for the
        temp directory and the RNG files: the copy of the state, the write and the hashing run in the
        background (:meth:`Checkpointer.save`).
        """
        started = time.perf_counter()
        skipped = None
        with self.window.paused():  # tokens/s counts training time only
            if stop is None:
                self.checkpointer.save(blocking=False)
            else:
                skipped = self.checkpointer.save_for_stop(stop.save_deadline())
        self.phases.add("checkpoint", time.perf_counter() - started)
        if not self.is_logger:
            return
        if skipped is not None:
            resumes = self.checkpointer.last_saved
            print(f"btk: {skipped}; {f'a restart resumes from step {resumes}' if resumes else 'nothing is saved'}",
                  flush=True)
            return
        seconds = time.perf_counter() - started
        if stop is None and self.checkpointer.asynchronous:
            print(f"btk: checkpoint step {self.state.step} handed to the background (staged and written while "
                  f"training goes on) in {seconds:.1f} s", flush=True)
            return
        # The rate a stop's save needs (btk.planner.stop_save, printed with the plan), here as this save achieved
        # it: its own write, without the wait for a background save that was still in flight.
        written = StopSave(self.config.spec.architecture.parameter_count, self.config.nnodes)
        own = self.checkpointer.save_seconds or seconds
        print(f"btk: checkpoint step {self.state.step} written in {seconds:.1f} s: {written.gib_per_node:,.1f} GiB "
              f"per node at {written.gib_per_node / max(own, 1e-9):.2f} GiB/s (a stop's save has "
              f"{written.seconds:.0f} s)", flush=True)

    def train_step(self, step: int, flag: StopFlag, result: RunResult) -> tuple[
            torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """One optimizer step: learning rate, accumulated gradients, clipping, update.

        Returns (summed loss, gradient norm, skipped), all device tensors nothing has read yet
        (:meth:`read_steps` does, on logging and checkpoint steps).

        None when a stop was agreed between micro-batches: the gradients are dropped and the
        sampler rewound to the step's start, so the checkpoint holds the last complete step and
        a resumed run redoes this one from its first micro-batch. A step whose loss or gradient
        norm is not finite on any rank is skipped: the flag, all-reduced on the device, is the
        fused optimizer's ``found_inf``, so the kernel leaves weights and moments as they were
        without the host waiting for the GPU; :meth:`read_steps` counts it later.
        """
        intent = self.spec.training
        lr = learning_rate(step, peak=intent.learning_rate, warmup=intent.warmup_steps, total=self.total_steps,
                           min_ratio=intent.min_learning_rate_ratio)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        data_position = self.sampler.state_dict()

        def stop_agreed(micro: int) -> bool:
            if self.config.on_micro_batch is not None:
                self.config.on_micro_batch(step, micro)
            with self.phases.phase("communication"):
                result.stop_reason = self.stop_agreement.poll(flag)
            return result.stop_reason.any

        loss_sum = forward_backward(self.model, self.windows, self.sampler, self.placement.device,
                                    self.spec.knobs.gradient_accumulation_steps,
                                    defer_all_reduce=self.shape.dp_replicate > 1, stop_agreed=stop_agreed,
                                    phases=self.phases, context=lambda: train_context(self.shape),
                                    batches=self.loader.next, mask_documents=self.spec.training.document_masking)
        if loss_sum is None:
            self.optimizer.zero_grad(set_to_none=True)
            self.sampler.load_state_dict(data_position)
            return None
        with self.phases.phase("communication"):
            grad_norm = clip_grad_norm(list(self.model.parameters()), intent.max_grad_norm)
            skipped = self.nonfinite_on_any_rank(loss_sum, grad_norm)
        with self.phases.phase("checkpoint"):
            self.checkpointer.wait_for_staging()  # a background save's copy of the weights is complete
        with self.phases.phase("optimizer"):
            optimizer = cast(Any, self.optimizer)
            optimizer.found_inf = skipped  # read by the fused AdamW kernel: 1 skips the whole update
            try:
                self.optimizer.step()
            finally:
                del optimizer.found_inf
            if self.precompute_float8_scales:
                from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

                precompute_float8_dynamic_scale_for_fsdp(self.model)
        return loss_sum, grad_norm, skipped

    def nonfinite_on_any_rank(self, loss_sum: torch.Tensor, grad_norm: torch.Tensor) -> torch.Tensor:
        """1.0 when some rank's loss or the gradient norm is not finite, else 0.0 (fp32 device tensor); collective,
        queued on the device: nothing here waits for the GPU."""
        bad = (~torch.isfinite(loss_sum.detach()) | ~torch.isfinite(grad_norm.detach().to(loss_sum.device)))
        flag = bad.to(torch.float32)  # 0-d: the shape the fused kernel takes for found_inf
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return flag

    def read_steps(self, result: RunResult) -> None:
        """Read the device values of the steps since the last read (one host sync): gradient norms and skips."""
        unread, self.unread = self.unread, []
        for step, loss_sum, grad_norm, skipped in unread:
            result.grad_norms[step] = float(grad_norm)
            if bool(skipped.item()):
                self.skip_nonfinite_step(step, loss_sum, grad_norm)

    def skip_nonfinite_step(self, step: int, loss_sum: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Count a step whose update was skipped; past ``job.max_nonfinite_steps`` such steps, fail the job."""
        self.state.nonfinite_steps += 1
        limit = self.spec.job.max_nonfinite_steps
        if self.is_logger:
            print(f"btk: step {step}: loss {float(loss_sum):.4g} / gradient norm {float(grad_norm):.4g} not finite, "
                  f"update skipped ({self.state.nonfinite_steps} so far, job.max_nonfinite_steps={limit})", flush=True)
        if self.state.nonfinite_steps > limit:
            raise BtkError(
                f"training diverged: loss or gradient norm not finite at step {step} "
                f"({self.state.nonfinite_steps} such steps, job.max_nonfinite_steps={limit}); lower "
                "train.learning_rate or raise train.warmup_steps, try precision=bf16, or restart from an earlier "
                "checkpoint"
            )

    def log(self, step: int, loss_sum: torch.Tensor, result: RunResult) -> None:
        """Average the loss over ranks, measure the window since the last line, print one metric line (rank 0)."""
        dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM)
        mean_loss = loss_sum.item() / self.placement.world
        tokens_per_second = self.tokens_per_gpu_step * self.window.steps / self.window.seconds()
        tflops = self.flops_per_token * tokens_per_second / 1e12
        mfu = tflops / self.peak_tflops if self.peak_tflops else 0.0
        device = self.placement.device
        peak_gib = torch.cuda.max_memory_allocated(device) / GIB if self.placement.on_gpu else 0.0
        nonfinite = self.state.nonfinite_steps
        result.losses[step] = mean_loss
        result.metrics.append({
            "step": step, "loss": mean_loss, "tokens_per_second_per_gpu": tokens_per_second,
            "tflops_per_gpu": tflops, "mfu": mfu, "peak_memory_gib": peak_gib, "nonfinite_steps": nonfinite,
        })
        if self.is_logger:
            print(format_metric_line(step=step, loss=mean_loss, tokens_per_second_per_gpu=tokens_per_second,
                                     tflops_per_gpu=tflops, mfu=mfu, peak_memory_gib=peak_gib,
                                     nonfinite_steps=nonfinite), flush=True)
            if not self.documents_told and self.windows.eos_token_id is not None:
                print(self.loader.documents_line(self.spec.training.document_masking), flush=True)  # a sample
                self.documents_told = True
        self.window.reset()

    def announce_stop(self, result: RunResult) -> None:
        """The final log line of a stopped run: why, what was dropped, what was saved."""
        if not self.is_logger:
            return
        dropped = (f" (step {result.dropped_step} cut short between micro-batches, redone on resume)"
                   if result.dropped_step is not None else "")
        if result.stop_reason.deadline_passed and not result.stop_reason.signalled and self.deadline is not None:
            terminated = self.deadline + CAPACITY_BLOCK_SAFETY_MARGIN
            ends = terminated + CAPACITY_BLOCK_TERMINATION_LEAD
            cause = (f"capacity block ends {describe_epoch(ends)}, its instances are terminated at "
                     f"{describe_epoch(terminated)}; stopping {CAPACITY_BLOCK_SAFETY_MARGIN / 60:.0f} min before")
        else:
            cause = "SIGTERM"
        if result.saved_step == result.steps_done:
            print(f"btk: {cause}: checkpoint at step {result.steps_done} written, exiting{dropped}", flush=True)
        elif result.steps_done <= (result.saved_step or 0):
            print(f"btk: {cause} at step {result.steps_done}: nothing to save, exiting{dropped}", flush=True)
        elif self.checkpointer.root is not None:
            print(f"btk: {cause} at step {result.steps_done}: its checkpoint could not be written before the "
                  f"deadline, steps after {result.saved_step or 0} are lost{dropped}", flush=True)
        else:
            print(f"btk: {cause} at step {result.steps_done}: no checkpoint directory, progress lost{dropped}",
                  flush=True)

    def print_run_summary(self, result: RunResult) -> None:
        """The once-per-run metric lines a rehearsal is judged and described by: how far the loss fell (its gate),
        the time to the first step, the step time's spread after the first window, peak reserved memory."""
        if len(result.losses) >= 2:
            steps = sorted(result.losses)
            print(format_loss_drop_line(first_loss=result.losses[steps[0]], last_loss=result.losses[steps[-1]]),
                  flush=True)
        if self.first_step_seconds is not None:
            print(format_own_line("first_step_seconds", self.first_step_seconds), flush=True)
        spread = step_time_spread([metrics["tokens_per_second_per_gpu"] for metrics in result.metrics[1:]])
        if spread is not None:
            print(format_own_line("step_time_spread", spread), flush=True)
        if self.placement.on_gpu:
            reserved = torch.cuda.max_memory_reserved(self.placement.device) / GIB
            print(format_own_line("peak_reserved_gib", reserved), flush=True)

    def finish(self, result: RunResult) -> None:
        """Say how far the loss fell; export the trained model; gather the full weights when a test asks for them."""
        if self.is_logger:
            self.print_run_summary(result)
        if self.config.model_dir is not None:
            export_model(self.model, self.spec, self.config.model_dir)
        if self.config.return_state:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            gathered = get_model_state_dict(
                self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            result.final_state = {name: value for name, value in gathered.items() if isinstance(value, torch.Tensor)}


def step_time_spread(tokens_per_second: list[float]) -> float | None:
    """(max - min) / median of the step time over metric windows (each window's tokens/s: its step time is the
    inverse); None for fewer than two windows."""
    seconds = sorted(1.0 / value for value in tokens_per_second if value > 0)
    if len(seconds) < 2:
        return None
    return (seconds[-1] - seconds[0]) / statistics.median(seconds)


def train(config: RunConfig) -> RunResult:
    """Run (or resume) training; the process group must be initialised or be initialisable from env."""
    return Trainer(config).train()


def export_model(model: Decoder, spec: JobHyperparameters, directory: Path) -> None:
    """Gather the full weights and write Hugging Face safetensors + config.json (rank 0)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() == 0:
        export_hf({k: v for k, v in state.items() if isinstance(v, torch.Tensor)}, spec.architecture, directory)
    dist.barrier()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="btk_trainer.train")
    parser.add_argument("--hyperparameters", type=Path, required=True, help="SageMaker hyperparameters.json")
    parser.add_argument("--data-dir", type=Path, default=None, help="shard dataset directory (default: synthetic)")
    parser.add_argument("--checkpoint-dir", type=Path, default=None)
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--nnodes", type=int, default=int(os.environ.get("BTK_NNODES", "1")))
    parser.add_argument("--failure-file", type=Path, default=None,
                        help="write a user error here as one line (SageMaker: /opt/ml/output/failure)")
    parser.add_argument("--ladder-state", type=Path,
                        default=Path(os.environ[LADDER_STATE_ENV]) if os.environ.get(LADDER_STATE_ENV) else None,
                        help="the node's knob-ladder state file (btk_trainer.ladder); without it an out-of-memory "
                        "does not step down")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Train from SageMaker's files; the exit status is :func:`exit_code`'s, 2 for a one-line user error, or
    :data:`~btk_trainer.ladder.EXIT_STEP_DOWN` when an out-of-memory before the first checkpoint sends the job to
    the next rung of its knob ladder (torchrun restarts it there, :mod:`btk_trainer.ladder`).

    Any other exception propagates (exit 1 with its traceback), so torchrun reports the job failed.
    """
    args = parse_args(argv)
    restart = int(os.environ.get(RESTART_COUNT_ENV) or 0)
    spec: JobHyperparameters | None = None
    rung = 0
    out_of_memory = False
    try:
        spec = load_hyperparameters(args.hyperparameters)
        rung, reason = current_rung(args.ladder_state, restart, spec)
        rung, resumed = resumed_rung(args.checkpoint_dir, spec, rung)
        reason = resumed or reason
        if args.checkpoint_dir is not None and len(rungs(spec)) > 1 and os.environ.get("LOCAL_RANK", "0") == "0":
            record_rung(args.checkpoint_dir, rung)  # each node's copy: SageMaker syncs its checkpoint folder
        if os.environ.get("RANK", "0") == "0" and len(rungs(spec)) > 1:
            if rung:
                print(f"btk: knob ladder rung {rung} of {len(rungs(spec)) - 1} ({reason}): "
                      f"{describe(rungs(spec)[rung])}", flush=True)
            # The job's metrics say which knobs it trained on, rung 0 included: the pipeline hands the rung a
            # rehearsal held to the long run (job.start_rung), so a job with a ladder always reports it.
            print(format_knob_rung_line(rung=rung), flush=True)
        result = train(RunConfig(spec=on_rung(spec, rung), data_dir=args.data_dir, checkpoint_dir=args.checkpoint_dir,
                                 model_dir=args.model_dir, nnodes=args.nnodes))
    except BtkError as error:
        return report_failure(str(error), args.failure_file)
    except torch.OutOfMemoryError as error:
        if spec is None:
            raise
        out_of_memory = True
        return _out_of_memory(args, spec, rung, restart, error)
    finally:
        # After an out-of-memory the other ranks wait in a collective this rank never joins: it leaves without
        # tearing the group down (torchrun stops them; the process exits right after, exit_without_finalizing).
        if dist.is_initialized() and not out_of_memory:
            dist.destroy_process_group()
    return exit_code(result)


def _out_of_memory(args: argparse.Namespace, spec: JobHyperparameters, rung: int, restart: int,
                   error: torch.OutOfMemoryError) -> int:
    """Step down the knob ladder if no checkpoint of this job exists yet; else fail in one line."""
    cause = str(error).split(". ")[0].splitlines()[0][:200] if str(error) else "out of memory"
    saved = latest_checkpoint(args.checkpoint_dir) if args.checkpoint_dir is not None else None
    if saved is not None:
        return report_failure(f"out of memory ({cause}) after the job's checkpoint of step {saved[0]}: the knobs "
                              "do not change past a checkpoint; plan the profile with more memory headroom",
                              args.failure_file)
    restarts, line = step_down(args.ladder_state, spec, rung, restart, cause, can_restart=args.nnodes == 1)
    if not restarts:
        return report_failure(line, args.failure_file)
    print(f"btk: {line}", flush=True)
    return EXIT_STEP_DOWN


if __name__ == "__main__":
    exit_without_finalizing(main())
