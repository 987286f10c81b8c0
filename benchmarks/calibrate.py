"""Fit the throughput model's two per-GPU constants to published torchtitan runs.

For each reference system the bf16 and float8-tensorwise tokens/s of the same run pin down
``achieved_matmul_fraction`` and ``non_matmul_overhead`` (two equations, two unknowns, solved
by bisection). Prints the fitted values and the model's errors on every published point;
``btk/hardware.py`` records the results. Run: ``.venv/bin/python benchmarks/calibrate.py``.
"""

from __future__ import annotations

import dataclasses

from btk.catalog import get_profile
from btk.hardware import REFERENCE_SYSTEMS, Fact, InstanceType
from btk.knobs import TrainingKnobs
from btk.planner.memory import estimate_memory
from btk.planner.throughput import estimate_throughput

# (system, knobs, published tokens/s per GPU, published peak GiB, source)
PUBLISHED = {
    "torchtitan-h100-96gb-8gpu": (
        dict(micro_batch_size=2, seq_len=8192, activation_checkpointing="selective", fused_loss=False),
        {"bf16": 6667.0, "fp8_tensorwise": 8532.0},
        {"bf16": 77.0, "fp8_tensorwise": 76.8},
        "torchtitan benchmarks/llama3_h100_202412_torchtitan.md, table 1 (FSDP + compile [+ Float8])",
    ),
    "torchtitan-b200-8gpu": (
        dict(micro_batch_size=1, seq_len=8192, activation_checkpointing="selective", fused_loss=True),
        {"bf16": 8307.5, "fp8_tensorwise": 10417.0, "mxfp8": 9969.0},
        {"bf16": 33.71, "fp8_tensorwise": 33.38, "mxfp8": 33.88},
        "torchtitan torchtitan/components/quantization/mxfp8.md, dense models table",
    ),
}


def with_constants(system: InstanceType, fraction: float, overhead: float) -> InstanceType:
    gpu = dataclasses.replace(
        system.gpu,
        achieved_matmul_fraction=Fact(fraction, "fit", "fit"),
        non_matmul_overhead=Fact(overhead, "fit", "fit"),
    )
    return dataclasses.replace(system, gpu=gpu)


def tokens_per_second(system: InstanceType, knobs: TrainingKnobs) -> float:
    arch = get_profile("llama3.1-8b").architecture
    return estimate_throughput(arch, knobs, system, nodes=1).tokens_per_second_per_gpu


def fit(name: str) -> tuple[float, float]:
    system = REFERENCE_SYSTEMS[name]
    knob_values, measured, _, _ = PUBLISHED[name]
    bf16 = TrainingKnobs.model_validate(knob_values)
    fp8 = bf16.model_copy(update={"precision": "fp8_tensorwise"})
    target_ratio = measured["fp8_tensorwise"] / measured["bf16"]

    def overhead_for(fraction: float) -> float:
        low, high = 0.0, 5.0  # bf16 speed falls as the overhead grows
        for _ in range(80):
            mid = (low + high) / 2
            if tokens_per_second(with_constants(system, fraction, mid), bf16) > measured["bf16"]:
                low = mid
            else:
                high = mid
        return (low + high) / 2

    def ratio(fraction: float) -> float:
        tuned = with_constants(system, fraction, overhead_for(fraction))
        return tokens_per_second(tuned, fp8) / tokens_per_second(tuned, bf16)

    low, high = 0.05, 1.0  # a higher matmul fraction shrinks the float8 gain relative to overhead
    for _ in range(60):
        mid = (low + high) / 2
        if ratio(mid) > target_ratio:
            low = mid
        else:
            high = mid
    fraction = (low + high) / 2
    return fraction, overhead_for(fraction)


def main() -> None:
    arch = get_profile("llama3.1-8b").architecture
    for name, (knob_values, measured, memory, source) in PUBLISHED.items():
        fraction, overhead = fit(name)
        system = with_constants(REFERENCE_SYSTEMS[name], fraction, overhead)
        print(f"{name}: achieved_matmul_fraction={fraction:.4f} non_matmul_overhead={overhead:.4f}  ({source})")
        for precision, tps in measured.items():
            knobs = TrainingKnobs.model_validate({**knob_values, "precision": precision})
            predicted = tokens_per_second(system, knobs)
            peak = estimate_memory(arch, knobs, 8, 1, system.hbm_gib).total
            print(
                f"  {precision:<15} tokens/s {predicted:8.0f} vs {tps:8.0f} ({predicted / tps - 1:+.1%})"
                f"   peak {peak:6.1f} GiB vs {memory[precision]:6.1f} ({peak / memory[precision] - 1:+.1%})"
            )


if __name__ == "__main__":
    main()
