"""GPU benchmark: train a profile for a few steps and set the measurement beside the planner's.

    python -m btk_trainer.bench --profile llama3.2-3b --instance ml.p5en.48xlarge --gpus 1 \\
        --precision bf16 --precision fp8_tensorwise --compare --json out.json --markdown out.md

Cases. For each profile: the planner's knobs with each ``--precision``; with ``--compare`` also
the planner's choice and the legacy baseline (``Plan.baseline``), with the measured and the
predicted speed-up. A case whose knobs equal an earlier case's is trained once. Knobs start from
the planner's plan for the profile on the instance (``--gpus`` overrides the GPUs per node, so
a 1-GPU machine is planned as one: no sharding, all memory on one GPU), then ``--precision`` /
``--set KEY=VALUE`` override them. Gradient accumulation is ``--accumulation`` (default 1) for
every case, measured and predicted alike: it barely changes tokens/s per GPU and keeps steps short.

Runs. Each case first gets a *throughput* run: ``--warmup`` + ``--steps`` steps on synthetic
tokens; over the timed steps: tokens/s per GPU, TFLOP/s per GPU, MFU (vs the GPU's dense bf16
peak from the btk hardware catalog) and peak memory, beside the planner's prediction for the
same knobs (``btk.planner.search.evaluate_knobs``). Once every case has had its throughput run,
two short diagnostic runs per case say where a step's time goes (``--no-phases`` skips them,
``--phase-runs N`` keeps them to the first N cases trained): *phases*, synchronised at every
phase boundary (seconds per phase), and *communication*, under ``torch.profiler`` (all
communication per step and its exposed part, the time no compute overlaps:
:mod:`btk_trainer.comm_profile`). A failed diagnostic run leaves the throughput figures
standing. Every run builds its own model; the model and its optimizer are freed, the
allocator's cache emptied and the peak-memory statistics reset before the next run starts.

Time budget. Before the first run the expected minutes per case and in total are printed, from
:data:`COST_MODEL` (estimates, see :class:`CostModel`); a run whose estimate would end past
``--budget-seconds`` (counted from ``--started-at``, a Unix time, default: when the benchmark
started) is skipped and says so; ``--plan-only`` prints that plan and stops. ``--json`` and
``--markdown`` are rewritten atomically after every run, so a timeout or a crash keeps
everything measured before it.

Every report is labelled with what it ran on, read at run time: the GPU, the NVIDIA driver
(``nvidia-smi``), torch and the CUDA it was built with, torchao, pydantic and Python.

Runs single-process (it creates its own 1-rank process group) or under torchrun.
``--tiny --device cpu`` swaps in a toy architecture to check the script without a GPU.

Test-only: ``--inject-failure N:WHAT`` (repeatable) makes case N (as numbered in the printed
plan) fail after the first step of one of its runs: ``throughput``, ``phases`` or
``communication`` raise an exception there; ``kill`` sends the process SIGKILL in its
throughput run, as the kernel's out-of-memory killer or a hard timeout would.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from btk.errors import BtkError
from btk.files import write_atomically
from btk.hardware import InstanceType, get_instance_type
from btk.hyperparameters import JobHyperparameters, JobSettings
from btk.knobs import TrainingKnobs, parse_knobs
from btk.profile import ModelArchitecture, ModelProfile

if TYPE_CHECKING:
    from btk_trainer.train import RunConfig, RunResult

#: Steps the profiled run records (:func:`btk_trainer.comm_profile.profile_communication`).
PROFILED_STEPS = 2
#: Steps of the phase-timed run.
PHASE_STEPS = 2
GIB = 1024**3

RunKind = Literal["throughput", "phases", "communication"]
RUN_KINDS: tuple[RunKind, ...] = ("throughput", "phases", "communication")
INJECTABLE = (*RUN_KINDS, "kill")

TINY = ModelArchitecture(
    num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=128,
    vocab_size=256, tied_embeddings=True, max_context=4096,
)


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Seconds one run is expected to take on one H200: the bench's budget decisions rest on it.

    These are ESTIMATES, not measurements. The steps' time is the planner's own prediction for
    the case (tokens per step / predicted tokens/s per GPU, ``btk.planner.throughput``); every
    other figure is a round allowance for work of that size that nothing here has timed on an
    H200 yet: starting CUDA and the process group, building, materialising and initialising
    the model and the optimizer, and Inductor compiling one transformer block's forward and
    backward plus the loss (the blocks are compiled one by one, so compile time does not grow
    with depth). Each run records its estimate beside its wall-clock seconds in the JSON
    report (``runs``), the data to refit these numbers from.
    """

    start: float = 30.0  # a script's start to the plan: wheel install, imports (torch, torchao), planning
    first_run_start: float = 20.0  # CUDA context and NCCL process group, once per process
    setup: float = 10.0  # meta model -> parallelize -> materialise -> initialise; optimizer
    compile_cold: float = 75.0  # Inductor, a case's first run (its throughput run): nothing cached
    compile_warm: float = 25.0  # a case's later runs: Dynamo traces again, Inductor's on-disk graph cache hits
    float8_compile_factor: float = 1.5  # float8 linears add their casts and scaling to each compiled graph
    phase_step_factor: float = 1.25  # a device synchronisation at every phase boundary
    profiler_step_factor: float = 1.5  # torch.profiler's own overhead on profiled steps
    profiler_trace: float = 10.0  # collecting and reading the trace
    tokens_per_second_without_prediction: float = 5_000.0  # when the planner has no figure for a case

    def seconds(self, kind: RunKind, knobs: TrainingKnobs, predicted_tokens_per_second: float | None, *,
                steps: int, compiled: bool, cold: bool, first_run: bool) -> float:
        """Expected seconds of one run of ``steps`` steps."""
        rate = predicted_tokens_per_second or self.tokens_per_second_without_prediction
        step = knobs.micro_batch_size * knobs.gradient_accumulation_steps * knobs.seq_len / rate
        step *= {"throughput": 1.0, "phases": self.phase_step_factor,
                 "communication": self.profiler_step_factor}[kind]
        compile_seconds = 0.0
        if compiled:
            compile_seconds = self.compile_cold if cold else self.compile_warm
            if knobs.precision != "bf16":
                compile_seconds *= self.float8_compile_factor
        fixed = self.setup + (self.first_run_start if first_run else 0.0)
        return fixed + compile_seconds + steps * step + (self.profiler_trace if kind == "communication" else 0.0)


COST_MODEL = CostModel()


@dataclasses.dataclass
class Case:
    """One set of knobs on one profile: what the planner predicts, what was measured."""

    number: int  # 1-based, in the order printed
    profile: ModelProfile
    label: str
    knobs: TrainingKnobs
    predicted: dict[str, Any]
    same_as: Case | None = None  # an earlier case with the same knobs: trained once
    measured: dict[str, Any] | None = None
    error: str | None = None
    note: str | None = None
    runs: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    @property
    def status(self) -> str:
        source = self.same_as or self
        if self.note == "prediction only":
            return "predicted only"
        if source.error and source.measured is None:
            return "skipped" if source.error.startswith("skipped") else "failed"
        if source.measured is not None:
            return "measured"
        return "pending"

    def as_json(self) -> dict[str, Any]:
        source = self.same_as or self
        record: dict[str, Any] = {
            "number": self.number, "profile": self.profile.name, "label": self.label, "status": self.status,
            "knobs": self.knobs.model_dump(), "predicted": self.predicted,
        }
        if source.measured is not None:
            record["measured"] = source.measured
        if source.error:
            record["error"] = source.error
        note = self.note or (f"same knobs as case {self.same_as.number}" if self.same_as else None)
        if note:
            record["note"] = note
        if self.runs:
            record["runs"] = self.runs
        return record


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run the bench plans: its case, its kind and its estimated seconds."""

    case: Case
    kind: RunKind
    steps: int
    estimated_seconds: float
    allowance_seconds: float = 0.0
    """The part of the estimate that is not the steps: start-up, set-up, compilation (:class:`CostModel`'s
    allowances), rescaled by what the throughput runs measured (:meth:`Bench.rescale_allowances`)."""


def _instance(name: str, gpus: int | None) -> InstanceType:
    instance = get_instance_type(name)
    if gpus is not None and gpus != instance.gpus_per_node:
        instance = dataclasses.replace(instance, gpus_per_node=gpus, name=f"{instance.name} ({gpus} GPU)")
    return instance


def _profile(name: str, tiny: bool, seq_len: int | None) -> ModelProfile:
    from btk.catalog import get_profile

    profile = get_profile(name)
    updates: dict[str, Any] = {}
    if tiny:
        updates["architecture"] = TINY
    if seq_len is not None or tiny:
        length = seq_len or 128
        updates["training"] = profile.training.model_copy(
            update={"seq_len": length, "global_batch_tokens": max(length, profile.training.global_batch_tokens)}
        )
    return profile.model_copy(update=updates) if updates else profile


def _knob_overrides(items: Sequence[str]) -> dict[str, str]:
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise BtkError(f"--set {item!r}: expected KEY=VALUE")
        overrides[key] = value
    return overrides


def _injections(items: Sequence[str]) -> set[tuple[int, str]]:
    """``--inject-failure N:WHAT`` values as (case number, what)."""
    parsed = set()
    for item in items:
        number, _, what = item.partition(":")
        if not number.isdigit() or int(number) < 1 or what not in INJECTABLE:
            raise BtkError(f"--inject-failure {item!r}: expected N:WHAT, N a case number from 1, "
                           f"WHAT one of {', '.join(INJECTABLE)}")
        parsed.add((int(number), what))
    return parsed


def prediction(profile: ModelProfile, instance: InstanceType, nodes: int, knobs: TrainingKnobs) -> dict[str, Any]:
    """The planner's numbers for these exact knobs (or why it has none)."""
    from btk.planner.search import evaluate_knobs

    try:
        evaluation = evaluate_knobs(profile, instance, nodes, knobs)
    except BtkError as error:
        return {"error": str(error)}
    return {
        "tokens_per_second_per_gpu": evaluation.estimate.tokens_per_second_per_gpu,
        "mfu": evaluation.estimate.mfu,
        "memory_gib": evaluation.memory.total,
        "fits": evaluation.fits,
    }


def nvidia_driver_version() -> str | None:
    """The NVIDIA driver's version as ``nvidia-smi`` reports it; None where there is none."""
    try:
        completed = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                   capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    versions = completed.stdout.split()
    return versions[0] if versions else None


def _distribution_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def run_environment(on_gpu: bool) -> dict[str, str | None]:
    """What the figures ran on, read now (not the image's pins): GPU, driver, torch, its CUDA, torchao, Python."""
    import torch

    return {
        "gpu": (torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU visible") if on_gpu else "cpu",
        "driver": nvidia_driver_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,  # None on a CPU build of torch
        "torchao": _distribution_version("torchao"),
        "pydantic": _distribution_version("pydantic"),
        "python": platform.python_version(),
    }


def environment_label(environment: dict[str, str | None]) -> str:
    """``NVIDIA H200, driver 580.159.04, torch 2.11.0+cu130 (CUDA 13.0), torchao 0.17.0, ...``"""
    return (f"{environment['gpu']}, NVIDIA driver {environment['driver'] or 'none found'}, "
            f"torch {environment['torch']} (CUDA {environment['cuda'] or 'none: a CPU build'}), "
            f"torchao {environment['torchao'] or 'not installed'}, pydantic {environment['pydantic']}, "
            f"Python {environment['python']}")


def release_device_memory(on_gpu: bool) -> None:
    """Free what the last run left (its model and optimizer wait for the cycle collector: FSDP2's modules
    hold reference cycles), hand the cached blocks back and reset the peak-memory statistics."""
    import torch

    gc.collect()
    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


class RunStoppedError(BtkError):
    """A run stopped by SIGTERM (``timeout``, a time limit): its figures are dropped and the bench stops."""


def _spec(case: Case, steps: int) -> JobHyperparameters:
    return JobHyperparameters(
        knobs=case.knobs, architecture=case.profile.architecture, training=case.profile.training,
        job=JobSettings(profile=case.profile.name, max_steps=steps, log_interval_steps=1,
                        checkpoint_interval_steps=10**9),
    )


def measure_throughput(result: RunResult, *, warmup: int, on_gpu: bool) -> dict[str, Any]:
    """Throughput over the timed steps (after ``warmup``) of a finished run; peak memory as the device saw it."""
    import torch

    timed = [m for m in result.metrics if m["step"] > warmup]
    if not timed:
        raise BtkError("no timed steps: raise --steps")
    # Equal tokens per step: the mean rate over the window is the harmonic mean of the step rates.
    rate = len(timed) / sum(1.0 / m["tokens_per_second_per_gpu"] for m in timed)
    scale = rate / timed[-1]["tokens_per_second_per_gpu"]
    return {
        "tokens_per_second_per_gpu": rate,
        "tflops_per_gpu": timed[-1]["tflops_per_gpu"] * scale,
        "mfu": timed[-1]["mfu"] * scale,
        "peak_memory_gib": max(m["peak_memory_gib"] for m in result.metrics),
        # What the caching allocator held (allocated + fragmentation): what "fits" really needs. Read before
        # the next run resets the statistics.
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / GIB if on_gpu else 0.0,
        "final_loss": timed[-1]["loss"],
        # Measured, where CostModel's compile allowances are assumed: model set-up, compilation and the first step.
        "first_step_seconds": result.first_step_seconds,
    }


class Bench:
    """The planned cases and runs, the report they fill in, and the files it is written to."""

    def __init__(self, args: argparse.Namespace, instance: InstanceType, environment: dict[str, str | None],
                 on_gpu: bool, started_at: float) -> None:
        self.args, self.instance, self.on_gpu, self.started_at = args, instance, on_gpu, started_at
        self.environment = environment
        self.cases: list[Case] = []
        self.runs: list[Run] = []
        self.injections = _injections(args.inject_failure)
        self.complete = False
        self.stopped = False  # a run was stopped by SIGTERM, or the device failed: no further runs

    # -- planning -----------------------------------------------------------------------------
    def add_case(self, profile: ModelProfile, label: str, knobs: TrainingKnobs) -> Case:
        knobs = knobs.model_copy(update={"gradient_accumulation_steps": self.args.accumulation})
        case = Case(number=len(self.cases) + 1, profile=profile, label=label, knobs=knobs,
                    predicted=prediction(profile, self.instance, self.args.nodes, knobs))
        case.same_as = next((c for c in self.cases if c.profile.name == profile.name and c.knobs == knobs), None)
        if self.args.predict_only:
            case.note = "prediction only"
        self.cases.append(case)
        return case

    def plan_runs(self) -> None:
        """Throughput runs of every case trained, then (unless ``--no-phases``) their diagnostic runs."""
        from btk_trainer.comm_profile import UNRECORDED_STEPS

        trained = [c for c in self.cases if c.same_as is None and c.note is None]
        steps: dict[RunKind, int] = {"throughput": self.args.warmup + self.args.steps, "phases": PHASE_STEPS,
                                     "communication": UNRECORDED_STEPS + PROFILED_STEPS}
        order: list[tuple[Case, RunKind]] = [(c, "throughput") for c in trained]
        diagnosed = [] if self.args.no_phases else trained[:self.args.phase_runs]
        order += [(c, kind) for c in diagnosed for kind in RUN_KINDS[1:]]
        for case, kind in order:
            seconds = COST_MODEL.seconds(
                kind, case.knobs, case.predicted.get("tokens_per_second_per_gpu"), steps=steps[kind],
                # A case's later runs find its graphs in Inductor's cache, filled by its throughput run.
                compiled=case.knobs.compile and self.on_gpu, cold=kind == "throughput", first_run=not self.runs)
            allowance = COST_MODEL.seconds(
                kind, case.knobs, case.predicted.get("tokens_per_second_per_gpu"), steps=0,
                compiled=case.knobs.compile and self.on_gpu, cold=kind == "throughput", first_run=not self.runs)
            self.runs.append(Run(case=case, kind=kind, steps=steps[kind], estimated_seconds=seconds,
                                 allowance_seconds=allowance))
            case.runs[kind] = {"status": "pending", "estimated_seconds": round(seconds, 1)}

    def elapsed(self) -> float:
        return time.time() - self.started_at

    def spent_before_runs(self) -> float:
        """Seconds gone before the first run: measured, or with ``--plan-only`` the cost model's start-up."""
        return COST_MODEL.start if self.args.plan_only else self.elapsed()

    def print_plan(self) -> None:
        """Expected minutes per case and in total, before anything runs; what the budget leaves out."""
        budget = self.args.budget_seconds
        print(f"btk-bench: running on {environment_label(self.environment)}", flush=True)
        spent = self.spent_before_runs()
        print(f"btk-bench: expected minutes (ESTIMATES from btk_trainer.bench.COST_MODEL, not measurements); "
              f"{spent / 60:.1f} min {'estimated' if self.args.plan_only else 'spent'} before the first run"
              + (f", budget {budget / 60:.1f} min" if budget is not None else ""), flush=True)
        clock, left_out = spent, []
        for case in self.cases:
            runs = [run for run in self.runs if run.case is case]
            if case.note:
                detail = case.note
            elif case.same_as is not None:
                detail = f"same knobs as case {case.same_as.number}, not trained again"
            else:
                detail = ", ".join(f"{run.kind} {run.estimated_seconds / 60:.1f}" for run in runs)
                detail = f"{sum(r.estimated_seconds for r in runs) / 60:.1f} min ({detail})"
            print(f"btk-bench:   case {case.number} {case.profile.name} / {case.label}: {detail}", flush=True)
        unmeasured: set[int] = set()  # cases whose throughput run is left out: their diagnostics go with it
        for run in self.runs:
            if run.case.number in unmeasured or (budget is not None and clock + run.estimated_seconds > budget):
                left_out.append(f"case {run.case.number} {run.kind}")
                if run.kind == "throughput":
                    unmeasured.add(run.case.number)
                continue
            clock += run.estimated_seconds
        total = spent + sum(run.estimated_seconds for run in self.runs)
        print(f"btk-bench: expected total {total / 60:.1f} min"
              + (f" of a {budget / 60:.1f}-min budget" if budget is not None else ""), flush=True)
        if left_out:
            print(f"btk-bench: expected to be skipped for the budget: {', '.join(left_out)} "
                  "(each run is checked again against the time really left before it starts)", flush=True)

    # -- running --------------------------------------------------------------------------------
    def run_all(self) -> None:
        """Each planned run in order, unless the bench stopped, its case has no figures or the budget is spent;
        the files are rewritten after each."""
        import torch

        previous_knobs: TrainingKnobs | None = None
        for index in range(len(self.runs)):
            run = self.runs[index]  # read each time: a measured run rescales the estimates of the runs after it
            case, record = run.case, run.case.runs[run.kind]
            if self.stopped:
                record["status"] = "not run: the bench was stopped (SIGTERM or a device failure)"
                continue
            if run.kind != "throughput" and case.measured is None:
                record["status"] = "not run: the throughput run has no figures"
                continue
            reason = self.over_budget(run)
            if reason:
                record["status"] = reason
                if run.kind == "throughput":
                    case.error = reason
                print(f"btk-bench: case {case.number} {run.kind}: {reason}", flush=True)
                self.flush()
                continue
            if case.knobs != previous_knobs:
                # Compiled code must not carry over from another case: Dynamo would recompile this case's
                # blocks with dynamic shapes (another hidden size or micro-batch), not the static ones a job gets.
                torch._dynamo.reset()
            previous_knobs = case.knobs
            print(f"btk-bench: case {case.number} {case.profile.name} / {case.label}: {run.kind} run "
                  f"(estimated {run.estimated_seconds / 60:.1f} min)", flush=True)
            started = time.perf_counter()
            error = self.attempt(run)
            record["wall_seconds"] = round(time.perf_counter() - started, 3)  # a run refused at once takes milliseconds
            try:
                release_device_memory(self.on_gpu)  # here, once the exception and the frames holding the model are gone
            except RuntimeError as device_error:  # a sticky CUDA error: nothing more can run in this process
                self.stopped = True
                error = error or f"the device failed after the run: {str(device_error).splitlines()[0]}"[:300]
            self.record_outcome(run, error)
            self.report_run(run)
            if error is None and run.kind == "throughput":
                self.rescale_allowances(index)
            self.flush()

    def rescale_allowances(self, index: int) -> None:
        """After throughput run ``index``: its measured start-up and compilation (the first step's seconds less
        one timed step) over the allowance :class:`CostModel` assumed for it rescales the allowances of the runs
        still to come, so the budget decides on measured compile times, not assumed ones."""
        run = self.runs[index]
        measured = run.case.measured or {}
        first, rate = measured.get("first_step_seconds"), measured.get("tokens_per_second_per_gpu")
        if not self.on_gpu or not first or not rate or run.allowance_seconds <= 0:
            return  # CostModel's allowances are a GPU's (a CPU check run compiles nothing)
        knobs = run.case.knobs
        observed = max(first - knobs.micro_batch_size * knobs.gradient_accumulation_steps * knobs.seq_len / rate,
                       0.0)
        factor = observed / run.allowance_seconds
        run.case.runs[run.kind]["start_and_compile_seconds"] = round(observed, 1)
        for later in range(index + 1, len(self.runs)):
            pending = self.runs[later]
            allowance = pending.allowance_seconds * factor
            estimate = pending.estimated_seconds - pending.allowance_seconds + allowance
            self.runs[later] = dataclasses.replace(pending, estimated_seconds=estimate, allowance_seconds=allowance)
            pending.case.runs[pending.kind]["estimated_seconds"] = round(estimate, 1)
        if index + 1 < len(self.runs):
            print(f"btk-bench: case {run.case.number}: start-up and compilation took {observed:.0f} s where "
                  f"{run.allowance_seconds:.0f} s was assumed: the later runs' allowances x{factor:.2f}", flush=True)

    def over_budget(self, run: Run) -> str | None:
        """Why ``run`` is skipped: its estimate would end past ``--budget-seconds``; None when it fits."""
        budget, ends = self.args.budget_seconds, self.elapsed() + run.estimated_seconds
        if budget is None or ends <= budget:
            return None
        return (f"skipped: estimated {run.estimated_seconds / 60:.1f} min would end at {ends / 60:.1f} min, "
                f"past the {budget / 60:.1f}-min budget")

    def record_outcome(self, run: Run, error: str | None) -> None:
        """A run's status; a failed throughput run is its case's error, a failed diagnostic run a note beside
        the throughput figures, which stand."""
        case, record = run.case, run.case.runs[run.kind]
        record["status"] = "failed" if error else "done"
        if not error:
            return
        record["error"] = error
        if run.kind == "throughput":
            case.error = error
        elif case.measured is not None:
            case.measured[f"{run.kind}_error"] = error

    def attempt(self, run: Run) -> str | None:
        """Do one run; None when it worked, else one line saying why not (the traceback goes to stderr)."""
        try:
            self.execute(run)
        except ImportError as error:
            return f"skipped: {error.name or error} not installed"
        except RunStoppedError as error:
            self.stopped = True
            return str(error)
        except BtkError as error:
            return str(error)
        except Exception as error:  # one failed run must not lose the others
            traceback.print_exc()
            first_line = str(error).splitlines()[0] if str(error) else ""
            return f"{type(error).__name__}: {first_line}"[:300]
        return None

    def _step_hook(self, run: Run) -> Callable[[int], None] | None:
        number = run.case.number
        if (number, "kill") in self.injections and run.kind == "throughput":
            def kill(step: int) -> None:
                os.kill(os.getpid(), signal.SIGKILL)
            return kill
        if (number, run.kind) in self.injections:
            def fail(step: int) -> None:
                raise RuntimeError(f"injected failure (--inject-failure {number}:{run.kind}) after step {step}")
            return fail
        return None

    def _config(self, run: Run, on_step_end: Callable[[int], None] | None = None, **overrides: Any) -> RunConfig:
        from btk_trainer.train import RunConfig

        injected = self._step_hook(run)
        hooks = [hook for hook in (on_step_end, injected) if hook is not None]

        def each_step(step: int) -> None:
            for hook in hooks:
                hook(step)

        return RunConfig(spec=_spec(run.case, run.steps), device=self.args.device, nnodes=self.args.nodes,
                         max_steps=run.steps, on_step_end=each_step if hooks else None, **overrides)

    def execute(self, run: Run) -> None:
        from btk_trainer.comm_profile import profile_communication
        from btk_trainer.train import train

        case, results = run.case, []

        def training(on_step_end: Callable[[int], None] | None = None, **overrides: Any) -> RunResult:
            result = train(self._config(run, on_step_end, **overrides))
            if result.interrupted:
                raise RunStoppedError(f"stopped by SIGTERM after step {result.steps_done} (time limit?): "
                                      "figures dropped, no further runs")
            results.append(result)
            return result

        if run.kind == "throughput":
            case.measured = measure_throughput(training(), warmup=self.args.warmup, on_gpu=self.on_gpu)
            return
        assert case.measured is not None
        if run.kind == "phases":
            # Synchronising the device at each phase boundary costs the overlap it measures, so the rate
            # comes from the unsynchronised throughput run: this one says where a step's time goes.
            phased = training(time_phases=True)
            case.measured["phase_seconds_per_step"] = {name: seconds / run.steps
                                                       for name, seconds in phased.phase_seconds.items()}
        else:
            # Unsynchronised, under torch.profiler: every collective of a step (FSDP2's and tensor
            # parallelism's inside forward and backward too) and the part of it no compute overlaps.
            communication = profile_communication(training, steps=PROFILED_STEPS, on_gpu=self.on_gpu)
            case.measured["communication_seconds_per_step"] = {"total": communication["communication_total"],
                                                               "exposed": communication["communication_exposed"]}

    def report_run(self, run: Run) -> None:
        record = run.case.as_json()
        if run.kind == "throughput":
            print(_row(record), flush=True)
        elif set(record.get("measured", {})) & {"phase_seconds_per_step", "communication_seconds_per_step"}:
            print(phase_line(record), flush=True)

    # -- reporting ------------------------------------------------------------------------------
    def comparisons(self) -> list[dict[str, Any]]:
        """Planner's choice / legacy baseline, measured and predicted, per profile (``--compare``)."""
        found = []
        for planned in (c for c in self.cases if c.label == "planner's choice"):
            baseline = next((c for c in self.cases
                             if c.label == "legacy baseline" and c.profile.name == planned.profile.name), None)
            if baseline is None:
                continue
            comparison: dict[str, Any] = {"profile": planned.profile.name}
            pm, bm = (c.as_json().get("measured") for c in (planned, baseline))
            if pm and bm:
                comparison["measured_ratio"] = pm["tokens_per_second_per_gpu"] / bm["tokens_per_second_per_gpu"]
            pp, bp = planned.predicted, baseline.predicted
            if "tokens_per_second_per_gpu" in pp and "tokens_per_second_per_gpu" in bp:
                comparison["predicted_ratio"] = pp["tokens_per_second_per_gpu"] / bp["tokens_per_second_per_gpu"]
            found.append(comparison)
        return found

    def report(self) -> dict[str, Any]:
        args = self.args
        return {
            "environment": self.environment, "ran_on": environment_label(self.environment),
            "instance": self.instance.name, "nodes": args.nodes, "warmup": args.warmup, "steps": args.steps,
            "accumulation": args.accumulation, "budget_seconds": args.budget_seconds,
            "elapsed_seconds": round(self.elapsed(), 1), "complete": self.complete, "plan_only": args.plan_only,
            # The model behind every run's estimated_seconds (estimates, see CostModel), to refit from wall_seconds.
            "cost_model": dataclasses.asdict(COST_MODEL),
            "cases": [case.as_json() for case in self.cases], "comparisons": self.comparisons(),
        }

    def flush(self) -> None:
        report = self.report()
        if self.args.json:
            write_atomically(self.args.json, json.dumps(report, indent=2, default=str) + "\n")
        if self.args.markdown:
            write_atomically(self.args.markdown, markdown(report))


def _ensure_process_group() -> None:
    if "RANK" in os.environ:
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)})


def _row(case: dict[str, Any]) -> str:
    m, p = case.get("measured", {}), case.get("predicted", {})

    def fmt(value: Any, pattern: str) -> str:
        return pattern.format(value) if isinstance(value, (int, float)) else "–"

    reserved = f" ({m['peak_reserved_gib']:.1f})" if m.get("peak_reserved_gib") else ""
    note = case.get("error") or case.get("note") or ("" if case.get("status") == "measured" else case.get("status"))
    return (
        f"| {case['profile']} | {case['label']} | {case['knobs']['precision']} | {case['knobs']['micro_batch_size']}"
        f"×{case['knobs']['seq_len']} | {case['knobs']['activation_checkpointing']} | "
        f"{fmt(m.get('tokens_per_second_per_gpu'), '{:,.0f}')} | {fmt(p.get('tokens_per_second_per_gpu'), '{:,.0f}')}"
        f" | {fmt(m.get('mfu'), '{:.1%}')} | {fmt(p.get('mfu'), '{:.1%}')} | "
        f"{fmt(m.get('peak_memory_gib'), '{:.1f}')}{reserved}"
        f" | {fmt(p.get('memory_gib'), '{:.1f}')} | {note or ''} |"
    )


def phase_line(case: dict[str, Any]) -> str:
    """``btk-bench phases <profile> / <case>: data 1.2 ms, forward ...; profiled communication 3.4 ms (exposed
    1.1 ms)`` (milliseconds per step)."""
    measured = case["measured"]
    phases = measured.get("phase_seconds_per_step", {})
    parts = [", ".join(f"{name} {seconds * 1000:.1f} ms" for name, seconds in phases.items())] if phases else []
    communication = measured.get("communication_seconds_per_step")
    if communication:
        parts.append(f"profiled communication {communication['total'] * 1000:.1f} ms "
                     f"(exposed {communication['exposed'] * 1000:.1f} ms)")
    return f"btk-bench phases {case['profile']} / {case['label']}: {'; '.join(parts)}"


def _ratio(value: float | None) -> str:
    return f"{value:.2f}×" if value else "–"


def markdown(report: dict[str, Any]) -> str:
    state = ("plan only: nothing trained" if report["plan_only"] else
             "complete" if report["complete"] else "INCOMPLETE (still running, or stopped early)")
    lines = [
        f"Ran on: {report['ran_on']}.",
        "",
        f"Planner instance: {report['instance']}; {report['warmup']} warm-up + {report['steps']} timed steps, "
        f"gradient_accumulation_steps={report['accumulation']}; {report['elapsed_seconds'] / 60:.1f} min; {state}.",
        "",
        "| profile | case | precision | micro-batch × seq | AC | tokens/s/GPU | predicted | MFU | predicted MFU"
        " | peak GiB (reserved) | predicted GiB | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *(_row(case) for case in report["cases"]),
    ]
    if report["comparisons"]:
        lines += ["", "| profile | planned / baseline measured | planned / baseline predicted |", "|---|---|---|"]
        for comparison in report["comparisons"]:
            measured, predicted = (comparison.get(key) for key in ("measured_ratio", "predicted_ratio"))
            lines.append(f"| {comparison['profile']} | {_ratio(measured)} | {_ratio(predicted)} |")
    phases = [phase_line(case) for case in report["cases"]
              if set(case.get("measured", {})) & {"phase_seconds_per_step", "communication_seconds_per_step"}
              and not case.get("note", "").startswith("same knobs")]
    if phases:
        lines += ["", "Where a step's time goes (ms per step):", "", *(f"- {line}" for line in phases)]
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="btk-bench", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--profile", action="append", required=True, help="profile name (repeatable)")
    parser.add_argument("--instance", default="ml.p5en.48xlarge", help="instance type the planner predicts for")
    parser.add_argument("--gpus", type=int, default=None, help="GPUs per node to plan for (default: the instance's)")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--precision", action="append", default=[], help="precision cases (repeatable)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="knob override")
    parser.add_argument("--accumulation", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=None, help="override the profile's sequence length")
    parser.add_argument("--compare", action="store_true", help="also run planned vs legacy baseline")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--no-phases", action="store_true", help="skip the phase-timed and profiled runs")
    parser.add_argument("--phase-runs", type=int, default=None, metavar="N",
                        help="phase-timed and profiled runs for the first N cases trained only (default: all)")
    parser.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    parser.add_argument("--tiny", action="store_true", help="toy architecture (script check on CPU)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None)
    parser.add_argument("--budget-seconds", type=float, default=None,
                        help="skip runs whose estimate would end past this many seconds after --started-at")
    parser.add_argument("--started-at", type=float, default=None,
                        help="Unix time the budget counts from (default: this process's start)")
    parser.add_argument("--predict-only", action="store_true", help="print the planner's side only (no training)")
    parser.add_argument("--plan-only", action="store_true",
                        help="print the expected minutes per case and in total, then stop (no training)")
    parser.add_argument("--inject-failure", action="append", default=[], metavar="N:WHAT",
                        help="tests only: make case N fail in a run (throughput, phases, communication) or kill it")
    return parser.parse_args(argv)


def build_bench(args: argparse.Namespace, *, on_gpu: bool, started_at: float) -> Bench:
    """The cases of ``args`` with the planner's predictions, and the runs they need with their estimates."""
    from btk.planner.search import plan_profile

    if args.phase_runs is not None and args.phase_runs < 0:
        raise BtkError(f"--phase-runs {args.phase_runs}: expected 0 or more")
    instance = _instance(args.instance, args.gpus)
    overrides = _knob_overrides(args.set)
    bench = Bench(args, instance, run_environment(on_gpu), on_gpu, started_at)
    for name in args.profile:
        profile = _profile(name, args.tiny, args.seq_len)
        plan = plan_profile(profile, instance, args.nodes)
        base = parse_knobs({**plan.knobs.model_dump(), **overrides})
        for precision in args.precision:
            bench.add_case(profile, f"planned knobs, {precision}", base.model_copy(update={"precision": precision}))
        if args.compare:
            bench.add_case(profile, "planner's choice", base)
            if plan.baseline is not None:
                bench.add_case(profile, "legacy baseline", plan.baseline.knobs)
    bench.plan_runs()
    return bench


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started_at = args.started_at if args.started_at is not None else time.time()

    import torch

    on_gpu = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cuda"
    if not args.plan_only:
        _ensure_process_group()
    try:
        bench = build_bench(args, on_gpu=on_gpu, started_at=started_at)
        bench.print_plan()
        bench.flush()
        if args.plan_only:
            return 0
        bench.run_all()
        bench.complete = not bench.stopped
        bench.flush()
    except BtkError as error:
        print(f"btk-bench: error: {error}", file=sys.stderr)
        return 2
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    print(markdown(bench.report()))
    return 0


if __name__ == "__main__":
    from btk_trainer.exiting import exit_without_finalizing

    exit_without_finalizing(main())
