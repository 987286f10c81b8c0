"""GPU benchmark: train a profile for a few steps and set the measurement beside the planner's.

    python -m btk_trainer.bench --profile llama3.2-3b --instance ml.p5en.48xlarge --gpus 1 \\
        --precision bf16 --precision fp8_tensorwise --compare --json out.json --markdown out.md

For each case it trains ``--warmup`` + ``--steps`` steps on synthetic tokens (no data needed)
with the given knobs and reports, over the timed steps only: tokens/s per GPU, TFLOP/s per
GPU, MFU (vs the GPU's dense bf16 peak from the btk hardware catalog) and peak memory; and
the planner's prediction for exactly the same knobs (``btk.planner.search.evaluate_knobs``).
``--compare`` also runs the planner's choice and the legacy baseline (``Plan.baseline``)
back to back and reports the measured and predicted speed-up. Two short extra runs per case
say where a step's time goes: one synchronised at every phase boundary (seconds per phase),
one under ``torch.profiler`` (all communication per step and its exposed part, the time no
compute overlaps: :mod:`btk_trainer.comm_profile`).

Knobs start from the planner's plan for the profile on the instance (``--gpus`` overrides
the GPUs per node, so a 1-GPU machine is planned as one: no sharding, all memory on one
GPU), then ``--precision`` / ``--set KEY=VALUE`` override them. Gradient accumulation is
set to ``--accumulation`` (default 1) for every case, measured and predicted alike: it
does not change tokens/s per GPU materially and keeps each step short.

Runs single-process (it creates its own 1-rank process group) or under torchrun.
``--tiny --device cpu`` swaps in a toy architecture to check the script without a GPU.
Each case is written to the JSON file as soon as it finishes; ``--budget-seconds`` skips
cases that would start after the budget is spent.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import socket
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from btk.errors import BtkError
from btk.hardware import InstanceType, get_instance_type
from btk.hyperparameters import JobHyperparameters, JobSettings
from btk.knobs import TrainingKnobs, parse_knobs
from btk.profile import ModelArchitecture, ModelProfile

#: Steps the profiled run records (:func:`btk_trainer.comm_profile.profile_communication`).
PROFILED_STEPS = 2

TINY = ModelArchitecture(
    num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=128,
    vocab_size=256, tied_embeddings=True, max_context=4096,
)


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


def measure(profile: ModelProfile, knobs: TrainingKnobs, *, warmup: int, steps: int, device: str | None,
            nnodes: int) -> dict[str, Any]:
    """Train ``warmup + steps`` steps; statistics over the timed steps."""
    import torch

    from btk_trainer.comm_profile import UNRECORDED_STEPS, profile_communication
    from btk_trainer.train import RunConfig, train

    spec = JobHyperparameters(
        knobs=knobs, architecture=profile.architecture, training=profile.training,
        job=JobSettings(profile=profile.name, max_steps=warmup + steps, log_interval_steps=1,
                        checkpoint_interval_steps=10**9),
    )
    # Compiled code must not carry over from the previous case: Dynamo would recompile this
    # case's blocks with dynamic shapes (another hidden size or micro-batch), not the static
    # ones a training job gets.
    torch._dynamo.reset()
    started = time.perf_counter()
    try:
        result = train(RunConfig(spec=spec, device=device, nnodes=nnodes, max_steps=warmup + steps))
        phased = train(RunConfig(spec=spec, device=device, nnodes=nnodes, max_steps=2, time_phases=True))
        on_gpu = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu")).type == "cuda"
        communication = profile_communication(
            lambda on_step_end: train(RunConfig(spec=spec, device=device, nnodes=nnodes, on_step_end=on_step_end,
                                                max_steps=UNRECORDED_STEPS + PROFILED_STEPS)),
            steps=PROFILED_STEPS, on_gpu=on_gpu)
    finally:
        # A failed case (out of memory, ...) must not leave its model and optimizer state on
        # the GPU for the next one: FSDP2's modules are freed only by the cycle collector.
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if result.interrupted:
        raise BtkError(f"stopped by SIGTERM after step {result.steps_done} (time limit?): figures dropped")
    timed = [m for m in result.metrics if m["step"] > warmup]
    if not timed:
        raise BtkError("no timed steps: raise --steps")
    # Equal tokens per step: the mean rate over the window is the harmonic mean of the step rates.
    rate = len(timed) / sum(1.0 / m["tokens_per_second_per_gpu"] for m in timed)
    scale = rate / timed[-1]["tokens_per_second_per_gpu"]
    measured = {
        "tokens_per_second_per_gpu": rate,
        "tflops_per_gpu": timed[-1]["tflops_per_gpu"] * scale,
        "mfu": timed[-1]["mfu"] * scale,
        "peak_memory_gib": max(m["peak_memory_gib"] for m in result.metrics),
        # What the caching allocator held (allocated + fragmentation): what "fits" really needs.
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 1024**3 if torch.cuda.is_available() else 0.0,
        "final_loss": timed[-1]["loss"],
        # A separate 2-step run synchronising the device at each phase boundary (it costs the overlap it
        # measures, so the rate above comes from the unsynchronised run): where a step's time goes.
        "phase_seconds_per_step": {name: seconds / 2 for name, seconds in phased.phase_seconds.items()},
        # A third run under torch.profiler, unsynchronised: every collective of a step (FSDP2's and tensor
        # parallelism's inside forward and backward too) and the part of it no compute overlaps.
        "communication_seconds_per_step": {"total": communication["communication_total"],
                                           "exposed": communication["communication_exposed"]},
        "wall_seconds": time.perf_counter() - started,
    }
    return measured


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
    return (
        f"| {case['profile']} | {case['label']} | {case['knobs']['precision']} | {case['knobs']['micro_batch_size']}"
        f"×{case['knobs']['seq_len']} | {case['knobs']['activation_checkpointing']} | "
        f"{fmt(m.get('tokens_per_second_per_gpu'), '{:,.0f}')} | {fmt(p.get('tokens_per_second_per_gpu'), '{:,.0f}')}"
        f" | {fmt(m.get('mfu'), '{:.1%}')} | {fmt(p.get('mfu'), '{:.1%}')} | "
        f"{fmt(m.get('peak_memory_gib'), '{:.1f}')}{reserved}"
        f" | {fmt(p.get('memory_gib'), '{:.1f}')} | "
        f"{case.get('error', '') or case.get('note', '')} |"
    )


def phase_line(case: dict[str, Any]) -> str:
    """``btk-bench phases <profile> / <case>: data 1.2 ms, forward ...; profiled communication 3.4 ms (exposed
    1.1 ms)`` (milliseconds per step)."""
    measured = case["measured"]
    phases = measured.get("phase_seconds_per_step", {})
    parts = ", ".join(f"{name} {seconds * 1000:.1f} ms" for name, seconds in phases.items())
    communication = measured.get("communication_seconds_per_step")
    if communication:
        parts += (f"; profiled communication {communication['total'] * 1000:.1f} ms "
                  f"(exposed {communication['exposed'] * 1000:.1f} ms)")
    return f"btk-bench phases {case['profile']} / {case['label']}: {parts}"


def _ratio(value: float | None) -> str:
    return f"{value:.2f}×" if value else "–"


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"Device: {report['device']}; torch {report['torch']}; planner instance: {report['instance']}; "
        f"{report['warmup']} warm-up + {report['steps']} timed steps, gradient_accumulation_steps="
        f"{report['accumulation']}.",
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
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="btk-bench", description=__doc__.split("\n\n")[0])
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
    parser.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    parser.add_argument("--tiny", action="store_true", help="toy architecture (script check on CPU)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None)
    parser.add_argument("--budget-seconds", type=float, default=None, help="skip cases starting after this")
    parser.add_argument("--predict-only", action="store_true", help="print the planner's side only (no training)")
    args = parser.parse_args(argv)

    import torch

    from btk.planner.search import plan_profile

    _ensure_process_group()
    started = time.perf_counter()
    instance = _instance(args.instance, args.gpus)
    overrides = _knob_overrides(args.set)
    on_gpu = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cuda"
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if on_gpu else "cpu",
        "torch": torch.__version__, "instance": instance.name, "nodes": args.nodes,
        "warmup": args.warmup, "steps": args.steps, "accumulation": args.accumulation,
        "cases": [], "comparisons": [],
    }
    measured_cache: dict[str, dict[str, Any]] = {}

    def flush() -> None:
        if args.json:
            args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
        if args.markdown:
            args.markdown.write_text(markdown(report))

    def run_case(profile: ModelProfile, label: str, knobs: TrainingKnobs) -> dict[str, Any]:
        knobs = knobs.model_copy(update={"gradient_accumulation_steps": args.accumulation})
        case: dict[str, Any] = {"profile": profile.name, "label": label, "knobs": knobs.model_dump(),
                                "predicted": prediction(profile, instance, args.nodes, knobs)}
        key = json.dumps([profile.name, case["knobs"]], sort_keys=True)
        if args.predict_only:
            case["note"] = "prediction only"
        elif key in measured_cache:
            case["measured"], case["note"] = measured_cache[key], "same knobs as an earlier case"
        elif args.budget_seconds is not None and time.perf_counter() - started > args.budget_seconds:
            case["error"] = "skipped: time budget spent"
        else:
            try:
                case["measured"] = measured_cache[key] = measure(
                    profile, knobs, warmup=args.warmup, steps=args.steps, device=args.device, nnodes=args.nodes)
            except ImportError as error:
                case["error"] = f"skipped: {error.name or error} not installed"
            except BtkError as error:
                case["error"] = str(error)
            except Exception as error:  # one failed case must not lose the others
                case["error"] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
                traceback.print_exc()
                if on_gpu:
                    torch.cuda.empty_cache()
        report["cases"].append(case)
        print(_row(case), flush=True)
        if "measured" in case:
            print(phase_line(case), flush=True)
        flush()
        return case

    try:
        for name in args.profile:
            profile = _profile(name, args.tiny, args.seq_len)
            plan = plan_profile(profile, instance, args.nodes)
            base = parse_knobs({**plan.knobs.model_dump(), **overrides})
            for precision in args.precision:
                run_case(profile, f"planned knobs, {precision}", base.model_copy(update={"precision": precision}))
            if args.compare:
                planned = run_case(profile, "planner's choice", base)
                baseline_knobs = plan.baseline.knobs if plan.baseline else None
                if baseline_knobs is None:
                    continue
                baseline = run_case(profile, "legacy baseline", baseline_knobs)
                comparison: dict[str, Any] = {"profile": profile.name}
                pm, bm = planned.get("measured"), baseline.get("measured")
                if pm and bm:
                    comparison["measured_ratio"] = pm["tokens_per_second_per_gpu"] / bm["tokens_per_second_per_gpu"]
                pp, bp = planned["predicted"], baseline["predicted"]
                if "tokens_per_second_per_gpu" in pp and "tokens_per_second_per_gpu" in bp:
                    comparison["predicted_ratio"] = pp["tokens_per_second_per_gpu"] / bp["tokens_per_second_per_gpu"]
                report["comparisons"].append(comparison)
                flush()
    except BtkError as error:
        print(f"btk-bench: error: {error}", file=sys.stderr)
        return 2
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    print(markdown(report))
    return 0


if __name__ == "__main__":
    from btk_trainer.exiting import exit_without_finalizing

    exit_without_finalizing(main())
