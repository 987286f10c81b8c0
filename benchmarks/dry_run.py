"""The dry run's evidence: the memory tracker validated on small models, and full-size dry runs beside published peaks.

Run: ``PYTHONPATH=containers:.:tests .venv/bin/python benchmarks/dry_run.py [--validate] [--published] [--cases]
[--format markdown]`` (no section named: all three; the trainer lives in ``containers/``, the fixture catalog in
``tests/``). ``python -m btk_trainer.dryrun --shipped`` dry-runs the user's own plans.

* ``--validate``: toy models (2 blocks of width 256, 8 ranks) run twice through the dry run,
  once with real tensors on the CPU under ``torch.profiler`` and once on fake tensors. Per knob
  set: the CPU allocator's peak (every allocation since the model was built), the tracker's
  peak with real tensors, and its peak on fake tensors, with the static parts (fp32 master
  shards, fp32 gradient shards, AdamW moments and step counts) beside their exact count
  (FSDP2 pads each parameter's first dimension to a multiple of the sharding ranks).
* ``--published``: every published run of ``btk/planner/calibration_points.json`` that states
  its peak memory, dry-run on its model, knobs, GPUs and node count with the loss those runs
  used (the micro-batch's logits whole). The dry run is eager: for a run that compiled,
  ``projected`` adds the planner's compiled-minus-eager difference, as the dry run of a plan
  does. The published figure is the CUDA caching allocator's peak *reserved* memory.
* ``--cases``: the plans the planner makes on the test suite's fixture catalog, reshaped where
  the planner does not choose them itself: tensor parallelism for LLaMA 65B over 2 nodes
  (the planner's alternative before its throughput model was refitted) and MXFP8 for Llama
  3.2 3B.

It prints seconds per run; ``docs/trainer.md`` ("Dry run") holds a recorded output.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence

import torch
from btk_trainer.dryrun import (
    GIB,
    DryRunCase,
    DryRunResult,
    cpu_allocator_peak,
    dry_run,
    profile_case,
    result_table,
    run_steps,
)
from btk_trainer.layout import mesh_shape
from btk_trainer.model import Decoder

from btk.hardware import get_instance_type
from btk.knobs import TrainingKnobs
from btk.planner.calibration import load_points
from btk.profile import ModelArchitecture, TrainingIntent
from btk.table import Column, Table

B200 = get_instance_type("ml.p6-b200.48xlarge")
TOY = ModelArchitecture(num_layers=2, hidden_size=256, num_attention_heads=8, num_kv_heads=2, ffn_hidden_size=1024,
                        vocab_size=4096, max_context=4096)
TOY_QWEN3 = TOY.model_copy(update={"head_dim": 64, "qk_norm": "head"})  # attention 512 wide on a 256 residual
TOY_OLMO2 = TOY.model_copy(update={"norm_placement": "post", "qk_norm": "projection"})
VALIDATION_KNOBS: tuple[tuple[str, ModelArchitecture, int, dict[str, object]], ...] = (
    ("bf16, no checkpointing", TOY, 1, {}),
    ("bf16, selective", TOY, 1, {"activation_checkpointing": "selective"}),
    ("bf16, full", TOY, 1, {"activation_checkpointing": "full"}),
    ("fp8 tensorwise (fp8 all-gather), selective", TOY, 1,
     {"precision": "fp8_tensorwise", "activation_checkpointing": "selective"}),
    ("fp8 rowwise", TOY, 1, {"precision": "fp8_rowwise"}),
    ("mxfp8 (emulated)", TOY, 1, {"precision": "mxfp8"}),
    ("bf16, hybrid shard over 2 nodes", TOY, 2, {"sharding": "hybrid_shard"}),
    ("bf16, tensor parallel 2", TOY, 1, {"tensor_parallel": 2}),
    ("fp8 tensorwise, tensor parallel 2", TOY, 1, {"precision": "fp8_tensorwise", "tensor_parallel": 2}),
    ("Qwen3 layout (head_dim 64, per-head QK-norm), TP 2", TOY_QWEN3, 1, {"tensor_parallel": 2}),
    ("OLMo 2 layout (post-norm, projection QK-norm), TP 2", TOY_OLMO2, 1, {"tensor_parallel": 2}),
)


def toy_case(arch: ModelArchitecture, nodes: int, **knobs: object) -> DryRunCase:
    """A toy model on ml.p6-b200.48xlarge: micro-batch 2 x 1024 tokens, two micro-batches per step."""
    values: dict[str, object] = {"micro_batch_size": 2, "seq_len": 1024, "gradient_accumulation_steps": 2,
                                 "compile": False, "fused_loss": False, **knobs}
    return DryRunCase(name="toy", architecture=arch, training=TrainingIntent(seq_len=1024, global_batch_tokens=1 << 16),
                      instance=B200, nodes=nodes, knobs=TrainingKnobs.model_validate(values))


def exact_static_bytes(case: DryRunCase) -> int:
    """Rank 0's fp32 master shards, fp32 gradient shards and AdamW moments under FSDP2 (tensor parallelism off):
    16 bytes per element of each parameter's shard (its first dimension padded to a multiple of the sharding
    ranks, then split), and AdamW's 4-byte step count per parameter."""
    with torch.device("meta"):
        model = Decoder(case.architecture)
    shape = mesh_shape(case.world_size, case.nodes, case.knobs)
    parameters = list(model.parameters())
    shards = sum(math.ceil(p.shape[0] / shape.dp_shard) * p[0].numel() for p in parameters)
    return 16 * shards + 4 * len(parameters)


def validate() -> tuple[list[str], list[str]]:
    rows = []
    for label, arch, nodes, knobs in VALIDATION_KNOBS:
        case = toy_case(arch, nodes, **knobs)
        allocator, real = cpu_allocator_peak(case)
        fake = run_steps(case)
        static = (real.parameters + real.gradients + real.optimizer) * GIB
        exact = exact_static_bytes(case) if case.knobs.tensor_parallel == 1 else None
        rows.append((label, allocator * 1024, real.total * 1024, fake.total * 1024, static, exact))

    def mib(index: int) -> Callable[[tuple[object, ...]], str]:
        return lambda row: f"{row[index]:.3f}"

    table: Table[tuple[object, ...]] = Table([
        Column("knobs", lambda row: str(row[0])),
        Column("CPU allocator MiB", mib(1), "right"),
        Column("tracker, real MiB", mib(2), "right"),
        Column("tracker, fake MiB", mib(3), "right"),
        Column("static bytes", lambda row: f"{row[4]:,.0f}", "right"),
        Column("exact count", lambda row: "-" if row[5] is None else f"{row[5]:,}", "right"),
    ])
    return table.text(rows), table.markdown(rows)


def published_cases() -> list[tuple[DryRunCase, float, bool]]:
    """(case, published GiB, whether the run compiled) for every published run that states its peak memory."""
    cases = []
    for point in load_points():
        if point.memory_gib is None:
            continue
        knobs = point.knobs
        batch = knobs.micro_batch_size * knobs.gradient_accumulation_steps * knobs.seq_len * point.gpus
        training = TrainingIntent(seq_len=knobs.seq_len, global_batch_tokens=batch)
        case = DryRunCase(name=point.model, architecture=point.architecture, training=training,
                          instance=point.system, nodes=point.nodes, knobs=knobs, label=point.id, whole_logits=True)
        cases.append((case, point.memory_gib, knobs.compile))
    return cases


def published() -> tuple[list[str], list[str]]:
    rows: list[tuple[DryRunResult, float, bool]] = []
    for case, memory_gib, compiled in published_cases():
        result = dry_run(case)
        rows.append((result, memory_gib, compiled))
        print(f"  {case.label}: {result.seconds:.0f} s", file=sys.stderr, flush=True)

    def gib(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    def error(value: float | None, published: float) -> str:
        return "-" if value is None else f"{value / published - 1:+.1%}"

    table: Table[tuple[DryRunResult, float, bool]] = Table([
        Column("published run", lambda row: row[0].case.label),
        Column("GPUs", lambda row: str(row[0].case.world_size), "right"),
        Column("published GiB", lambda row: f"{row[1]:.1f}", "right"),
        Column("planner GiB", lambda row: gib(row[0].planned.total), "right"),
        Column("dry run (eager) GiB", lambda row: gib(row[0].measured.total if row[0].measured else None), "right"),
        Column("projected GiB", lambda row: gib(row[0].projected_gib if row[2] else None), "right"),
        Column("dry run vs published",
               lambda row: error(row[0].projected_gib if row[2] else (row[0].measured.total if row[0].measured
                                                                      else None), row[1]), "right"),
        Column("planner vs published", lambda row: error(row[0].planned.total, row[1]), "right"),
        Column("seconds", lambda row: f"{row[0].seconds:.0f}", "right"),
        Column("error", lambda row: row[0].error or ""),
    ])
    return table.text(rows), table.markdown(rows)


def fixture_cases() -> list[DryRunCase]:
    from fixture_catalog import PROFILES

    return [
        profile_case(PROFILES["llama-65b"], B200, 2, {"tensor_parallel": "2", "micro_batch_size": "8"}),
        profile_case(PROFILES["llama3.2-3b"], B200, 1, {"precision": "mxfp8"}),
        profile_case(PROFILES["qwen2.5-32b"], B200, 2),
    ]


def cases() -> tuple[list[str], list[str]]:
    results = []
    for case in fixture_cases():
        results.append(dry_run(case))
        print(f"  {case.name} {case.label}: {results[-1].seconds:.0f} s", file=sys.stderr, flush=True)
    table = result_table(0.10)
    seconds = Table([Column("profile", lambda r: r.case.name), Column("seconds", lambda r: f"{r.seconds:.0f}",
                                                                       "right")])
    return [*table.text(results), "", *seconds.text(results)], table.markdown(results)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--validate", action="store_true", help="the tracker against real tensors and the allocator")
    parser.add_argument("--published", action="store_true", help="dry runs of the published runs with a peak")
    parser.add_argument("--cases", action="store_true", help="full-size dry runs on the fixture catalog")
    parser.add_argument("--format", choices=("text", "markdown"), default="text")
    args = parser.parse_args(argv)
    sections = [name for name in ("validate", "published", "cases") if getattr(args, name)] or [
        "validate", "published", "cases"]
    for name in sections:
        started = time.perf_counter()
        text, markdown = {"validate": validate, "published": published, "cases": cases}[name]()
        print(f"## {name} ({time.perf_counter() - started:.0f} s)")
        print("\n".join(markdown if args.format == "markdown" else text))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
