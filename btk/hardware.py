"""Hardware catalog: the SageMaker instance types the planner knows.

Every number carries its source and the date it was read (``Fact``). Prices are on-demand
list prices in USD per instance-hour and change over time: they are marked as estimates
and should be checked against the current price list before budgeting.

``achieved_matmul_fraction`` and ``non_matmul_overhead`` are not datasheet numbers: they are
the fraction of dense peak a PyTorch (torchtitan-style) training step reaches on the GPU's
matmuls, and the non-matmul time relative to the bf16 matmul time, fitted by
``benchmarks/calibrate.py`` to published torchtitan measurements (``docs/calibration.md``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from btk.errors import UnknownNameError
from btk.knobs import Precision

GIB = 1024**3


@dataclass(frozen=True)
class Fact:
    """A number with where and when it was read."""

    value: float
    source: str
    date: str
    estimate: bool = False


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model's facts."""

    name: str
    architecture: str
    hbm_gib: Fact
    hbm_bandwidth_tbps: Fact
    dense_tflops: dict[str, Fact]
    nvlink_gbps_per_direction: Fact
    achieved_matmul_fraction: Fact
    non_matmul_overhead: Fact

    @property
    def supported_precisions(self) -> tuple[str, ...]:
        return tuple(self.dense_tflops)

    def supports(self, precision: str) -> bool:
        return precision in self.dense_tflops

    def peak_tflops(self, precision: str) -> float:
        return self.dense_tflops[precision].value


@dataclass(frozen=True)
class InstanceType:
    """A SageMaker training instance type."""

    name: str
    gpu: GpuSpec
    gpus_per_node: int
    efa_gbps_per_node: Fact
    usd_per_hour: Fact
    notes: str = ""
    aliases: tuple[str, ...] = field(default_factory=tuple)

    @property
    def hbm_gib(self) -> float:
        return self.gpu.hbm_gib.value


NVIDIA_B200_DATASHEET = "NVIDIA HGX B200 datasheet (dense = half the sparse figure)"
NVIDIA_H200_DATASHEET = "NVIDIA H200 Tensor Core GPU datasheet (SXM, dense)"
NVIDIA_H100_DATASHEET = "NVIDIA H100 Tensor Core GPU datasheet (SXM, dense)"
NVIDIA_A100_DATASHEET = "NVIDIA A100 Tensor Core GPU datasheet (dense)"
CALIBRATION_DOC = "btk calibration, docs/calibration.md"

B200 = GpuSpec(
    name="NVIDIA B200",
    architecture="blackwell",
    hbm_gib=Fact(179.0, "nvidia-smi on ml.p6-b200.48xlarge: 183,359 MiB per GPU", "2025-06"),
    hbm_bandwidth_tbps=Fact(7.7, NVIDIA_B200_DATASHEET, "2025-03"),
    dense_tflops={
        "bf16": Fact(2250.0, NVIDIA_B200_DATASHEET, "2025-03"),
        "fp8_tensorwise": Fact(4500.0, NVIDIA_B200_DATASHEET, "2025-03"),
        "fp8_rowwise": Fact(4500.0, NVIDIA_B200_DATASHEET, "2025-03"),
        "mxfp8": Fact(4500.0, NVIDIA_B200_DATASHEET, "2025-03"),
    },
    nvlink_gbps_per_direction=Fact(900.0, "NVLink 5: 1.8 TB/s bidirectional per GPU", "2025-03"),
    achieved_matmul_fraction=Fact(
        0.432, "benchmarks/calibrate.py fit to torchtitan Llama 3 8B, 8x B200 (power-limited), bf16+fp8", "2025-08"
    ),
    non_matmul_overhead=Fact(
        0.652, "benchmarks/calibrate.py fit to torchtitan Llama 3 8B, 8x B200 (power-limited), bf16+fp8", "2025-08"
    ),
)

H200 = GpuSpec(
    name="NVIDIA H200",
    architecture="hopper",
    hbm_gib=Fact(140.4, "nvidia-smi on H200 SXM: 143,771 MiB", "2026-10"),
    hbm_bandwidth_tbps=Fact(4.8, NVIDIA_H200_DATASHEET, "2024-11"),
    dense_tflops={
        "bf16": Fact(989.0, NVIDIA_H200_DATASHEET, "2024-11"),
        "fp8_tensorwise": Fact(1979.0, NVIDIA_H200_DATASHEET, "2024-11"),
        "fp8_rowwise": Fact(1979.0, NVIDIA_H200_DATASHEET, "2024-11"),
    },
    nvlink_gbps_per_direction=Fact(450.0, "NVLink 4: 900 GB/s bidirectional per GPU", "2024-11"),
    achieved_matmul_fraction=Fact(
        0.577, "benchmarks/calibrate.py fit to torchtitan Llama 3 8B, 8x H100 (500 W), bf16+fp8", "2024-12"
    ),
    non_matmul_overhead=Fact(
        0.209, "benchmarks/calibrate.py fit to torchtitan Llama 3 8B, 8x H100 (500 W), bf16+fp8", "2024-12"
    ),
)

H100 = GpuSpec(
    name="NVIDIA H100 80GB",
    architecture="hopper",
    hbm_gib=Fact(79.6, "nvidia-smi on H100 SXM 80GB: 81,559 MiB", "2024-06"),
    hbm_bandwidth_tbps=Fact(3.35, NVIDIA_H100_DATASHEET, "2024-06"),
    dense_tflops={
        "bf16": Fact(989.0, NVIDIA_H100_DATASHEET, "2024-06"),
        "fp8_tensorwise": Fact(1979.0, NVIDIA_H100_DATASHEET, "2024-06"),
        "fp8_rowwise": Fact(1979.0, NVIDIA_H100_DATASHEET, "2024-06"),
    },
    nvlink_gbps_per_direction=Fact(450.0, "NVLink 4: 900 GB/s bidirectional per GPU", "2024-06"),
    achieved_matmul_fraction=Fact(
        0.577, "benchmarks/calibrate.py fit to torchtitan Llama 3 8B, 8x H100 (500 W), bf16+fp8", "2024-12"
    ),
    non_matmul_overhead=Fact(
        0.209, "benchmarks/calibrate.py fit to torchtitan Llama 3 8B, 8x H100 (500 W), bf16+fp8", "2024-12"
    ),
)

A100_80GB = GpuSpec(
    name="NVIDIA A100 80GB",
    architecture="ampere",
    hbm_gib=Fact(80.0, "nvidia-smi on A100 SXM 80GB: 81,920 MiB", "2023-06"),
    hbm_bandwidth_tbps=Fact(2.039, NVIDIA_A100_DATASHEET, "2023-06"),
    dense_tflops={"bf16": Fact(312.0, NVIDIA_A100_DATASHEET, "2023-06")},
    nvlink_gbps_per_direction=Fact(300.0, "NVLink 3: 600 GB/s bidirectional per GPU", "2023-06"),
    achieved_matmul_fraction=Fact(
        0.577, "assumed equal to Hopper's fit (no A100 calibration run)", "2024-12", estimate=True
    ),
    non_matmul_overhead=Fact(
        0.209, "assumed equal to Hopper's fit (no A100 calibration run)", "2024-12", estimate=True
    ),
)

# Reference GPU of the torchtitan 2024-12 benchmarks: H100 with 96 GB HBM2e at 500 W.
H100_96GB_GRAND_TETON = GpuSpec(
    name="NVIDIA H100 96GB (Grand Teton, 500 W)",
    architecture="hopper",
    hbm_gib=Fact(94.5, "torchtitan benchmarks/llama3_h100_202412_torchtitan.md (96 GB HBM2e)", "2024-12"),
    hbm_bandwidth_tbps=Fact(2.4, "torchtitan benchmarks/llama3_h100_202412_torchtitan.md", "2024-12"),
    dense_tflops=H100.dense_tflops,
    nvlink_gbps_per_direction=H100.nvlink_gbps_per_direction,
    achieved_matmul_fraction=H100.achieved_matmul_fraction,
    non_matmul_overhead=H100.non_matmul_overhead,
)

PRICE_NOTE = "AWS on-demand list price, us-east-1, approximate; verify before budgeting"

INSTANCE_TYPES: dict[str, InstanceType] = {
    instance.name: instance
    for instance in (
        InstanceType(
            "ml.p6-b200.48xlarge",
            B200,
            8,
            efa_gbps_per_node=Fact(3200.0, "AWS P6-B200 instance page: 3.2 Tbps EFAv4", "2025-05"),
            usd_per_hour=Fact(113.93, PRICE_NOTE, "2025-06", estimate=True),
            aliases=("p6-b200", "b200"),
        ),
        InstanceType(
            "ml.p5en.48xlarge",
            H200,
            8,
            efa_gbps_per_node=Fact(3200.0, "AWS P5en instance page: 3.2 Tbps EFAv3", "2024-09"),
            usd_per_hour=Fact(63.30, PRICE_NOTE, "2025-06", estimate=True),
            aliases=("p5en", "h200"),
        ),
        InstanceType(
            "ml.p5.48xlarge",
            H100,
            8,
            efa_gbps_per_node=Fact(3200.0, "AWS P5 instance page: 3.2 Tbps EFAv2", "2023-07"),
            usd_per_hour=Fact(55.04, PRICE_NOTE, "2025-06", estimate=True),
            aliases=("p5", "h100"),
        ),
        InstanceType(
            "ml.p4de.24xlarge",
            A100_80GB,
            8,
            efa_gbps_per_node=Fact(400.0, "AWS P4de instance page: 400 Gbps EFA", "2022-05"),
            usd_per_hour=Fact(27.45, PRICE_NOTE, "2025-06", estimate=True),
            aliases=("p4de", "a100"),
        ),
    )
}

DEFAULT_INSTANCE_TYPE = "ml.p6-b200.48xlarge"


def get_instance_type(name: str) -> InstanceType:
    """Look an instance type up by name or alias (``ml.p5.48xlarge``, ``p5``, ``h100``)."""
    if name in INSTANCE_TYPES:
        return INSTANCE_TYPES[name]
    for instance in INSTANCE_TYPES.values():
        if name.lower() in instance.aliases or f"ml.{name}" == instance.name:
            return instance
    known = ", ".join(INSTANCE_TYPES)
    raise UnknownNameError(f"instance type {name!r} is not in the hardware catalog; use one of: {known}")


def supports_precision(instance: InstanceType, precision: Precision) -> bool:
    return instance.gpu.supports(precision)


# Systems of published measurements, used to calibrate the models (not SageMaker instances).
REFERENCE_SYSTEMS: dict[str, InstanceType] = {
    "torchtitan-h100-96gb-8gpu": InstanceType(
        "torchtitan-h100-96gb-8gpu",
        H100_96GB_GRAND_TETON,
        8,
        efa_gbps_per_node=Fact(3200.0, "torchtitan benchmark: 400 Gb/s RDMA per GPU", "2024-12"),
        usd_per_hour=Fact(0.0, "not a rentable instance", "2024-12", estimate=True),
    ),
    "torchtitan-b200-8gpu": InstanceType(
        "torchtitan-b200-8gpu",
        B200,
        8,
        efa_gbps_per_node=Fact(3200.0, "single node: not used", "2025-08"),
        usd_per_hour=Fact(0.0, "not a rentable instance", "2025-08", estimate=True),
    ),
}
