"""Hardware catalog: the SageMaker instance types the planner knows.

Every number carries its source and the date it was read (``Fact``). Prices are on-demand
list prices in USD per instance-hour and change over time: they are marked as estimates
and should be checked against the current price list before budgeting.

``achieved_matmul_fraction``, ``non_matmul_overhead`` and ``attention_efficiency`` are not
datasheet numbers: they are the fraction of dense peak a PyTorch (torchtitan-style) training
step reaches on the GPU's linear layers, the multiple of the counted element-wise HBM traffic
its non-matmul work takes, and flash attention's rate relative to the linear layers
(``btk/planner/throughput.py``), fitted per GPU family by ``benchmarks/calibrate.py`` to
published measurements (``docs/calibration.md``). ``CollectiveTiming`` is how collectives
between nodes behave on a fabric, fitted to a published nccl-tests sweep.
"""

from __future__ import annotations

import math
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
class Offer:
    """Whether AWS offers something for an instance type, with where and when that was read."""

    offered: bool
    source: str
    date: str


#: Managed spot training is assumed absent unless a source shows it for the instance type.
SPOT_NOT_SHOWN = Offer(False, "no AWS source found listing it for SageMaker managed spot training", "2025-06")


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
    attention_efficiency: Fact
    """Flash attention's rate relative to ``achieved_matmul_fraction`` (fitted, like it)."""
    compute_capability: tuple[int, int]
    """What ``torch.cuda.get_device_capability()`` reads on it (https://developer.nvidia.com/cuda-gpus)."""
    evidence_family: str = ""
    """Which published runs speak for it (the error band's GPU family); default: its architecture. A GPU
    whose efficiency is assumed from another's fit has a family of its own, with no published run."""

    @property
    def family(self) -> str:
        """The GPU family of the planner's error band (:attr:`evidence_family`, else the architecture)."""
        return self.evidence_family or self.architecture

    @property
    def supported_precisions(self) -> tuple[str, ...]:
        return tuple(self.dense_tflops)

    def supports(self, precision: str) -> bool:
        return precision in self.dense_tflops

    def peak_tflops(self, precision: str) -> float:
        return self.dense_tflops[precision].value


@dataclass(frozen=True)
class CollectiveTiming:
    """How long an NCCL collective between nodes takes on a fabric, as a function of the node count N.

    ``time = latency(N) + bus bytes / (nominal node bandwidth × bandwidth_fraction(N))``, with
    ``latency(N) = latency + latency_per_doubling × log2 N`` and ``bandwidth_fraction(N) =
    min(1, bandwidth_fraction − bandwidth_fraction_per_doubling × log2 N)``. "Bus bytes" are
    nccl-tests' (``busbw``): a ring moves ``(n−1)/n`` of the buffer per rank for an all-gather
    or a reduce-scatter and twice that for an all-reduce, and for rings through every GPU of
    a node it approaches the node's network bandwidth (see
    :attr:`InstanceType.nominal_allreduce_busbw_gbps`).
    """

    latency_seconds: Fact
    latency_seconds_per_doubling: Fact
    bandwidth_fraction: Fact
    bandwidth_fraction_per_doubling: Fact

    def latency(self, nodes: int) -> float:
        return self.latency_seconds.value + self.latency_seconds_per_doubling.value * math.log2(max(nodes, 1))

    def bandwidth_share(self, nodes: int) -> float:
        """The share of the nominal node bandwidth a collective's bus bandwidth reaches on ``nodes`` nodes."""
        share = self.bandwidth_fraction.value - self.bandwidth_fraction_per_doubling.value * math.log2(max(nodes, 1))
        return min(1.0, max(MIN_BANDWIDTH_SHARE, share))


#: Below a tenth of the nominal bandwidth the fit above would be extrapolated far past its data.
MIN_BANDWIDTH_SHARE = 0.1

EFA_P5_NCCL = (
    "least-squares fit to nccl-tests all_reduce_perf on 2-32 x p5.48xlarge (3,200 Gbit/s EFA, aws-ofi-nccl, "
    "SageMaker HyperPod), 32 MiB-8 GiB: crazyguitar/aws-gpu-communication-benchmark data/nccl_all_reduce.csv "
    "(docs/calibration.md, 'Collectives between nodes')"
)
#: Measured on P5 (EFAv2). The other EFA instance types are assumed to reach the same latency and
#: the same share of their own nominal bandwidth: no published nccl-tests sweep over node counts
#: was found for them.
EFA_COLLECTIVES = CollectiveTiming(
    latency_seconds=Fact(137e-6, EFA_P5_NCCL, "2026-12"),
    latency_seconds_per_doubling=Fact(174e-6, EFA_P5_NCCL, "2026-12"),
    bandwidth_fraction=Fact(0.999, EFA_P5_NCCL + "; fitted over 4-32 nodes (2 nodes exceed nominal)", "2026-12"),
    bandwidth_fraction_per_doubling=Fact(0.061, EFA_P5_NCCL + "; fitted over 4-32 nodes", "2026-12"),
)
EFA_COLLECTIVES_ASSUMED = CollectiveTiming(
    *(
        Fact(fact.value, f"assumed equal to P5's: {fact.source}", fact.date, estimate=True)
        for fact in (
            EFA_COLLECTIVES.latency_seconds,
            EFA_COLLECTIVES.latency_seconds_per_doubling,
            EFA_COLLECTIVES.bandwidth_fraction,
            EFA_COLLECTIVES.bandwidth_fraction_per_doubling,
        )
    )
)


@dataclass(frozen=True)
class UltraServer:
    """An UltraServer type: ``instances`` instances of one type in one NVLink domain, booked as a unit.

    A training plan for an UltraServer instance type is searched and bought by UltraServer type and
    count (SearchTrainingPlanOfferings' ``UltraServerType``/``UltraServerCount``).
    """

    name: str
    instances: int
    source: str
    date: str


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
    #: Environment of the training processes on this instance type (NCCL/libfabric settings);
    #: the entrypoint applies it, so an image runs unchanged on instances without EFA.
    network_environment: dict[str, str] = field(default_factory=dict)
    #: Managed spot training (``EnableManagedSpotTraining``) on this type; environments asking
    #: for spot where it is not offered are refused at synth.
    managed_spot: Offer = SPOT_NOT_SHOWN
    #: How collectives between nodes of this type behave (latency, bandwidth share by node count).
    collectives: CollectiveTiming = EFA_COLLECTIVES_ASSUMED
    #: The CPU architecture the training image is built for (``arm64`` on Grace-based instances).
    cpu_architecture: str = "x86_64"
    #: The UltraServer types this instance type is sold in, largest NVLink domain first (empty: none).
    ultraservers: tuple[UltraServer, ...] = ()

    @property
    def nvlink_domain_nodes(self) -> int:
        """How many instances of this type one NVLink domain joins (1 outside an UltraServer).

        A job of at most this many instances, placed on one UltraServer, runs every collective over
        NVLink; beyond it, collectives between UltraServers cross EFA.
        """
        return self.ultraservers[0].instances if self.ultraservers else 1

    def ultraserver(self, name: str | None = None) -> UltraServer:
        """The UltraServer type ``name`` (default: the largest) this instance type is sold in."""
        for candidate in self.ultraservers:
            if name is None or candidate.name == name:
                return candidate
        known = ", ".join(candidate.name for candidate in self.ultraservers) or "none"
        raise UnknownNameError(f"{self.name} is not sold in UltraServer type {name!r}; its UltraServer types: {known}")

    @property
    def hbm_gib(self) -> float:
        return self.gpu.hbm_gib.value

    @property
    def has_efa(self) -> bool:
        return self.efa_gbps_per_node.value > 0

    @property
    def nominal_allreduce_busbw_gbps(self) -> float:
        """Nominal inter-node all-reduce bus bandwidth, GB/s: the node's EFA bandwidth in bytes.

        A ring all-reduce across nodes moves each node's share over all of its EFA devices at
        once, so NCCL's bus bandwidth (nccl-tests' ``busbw``) tends to the node's network
        bandwidth: 3,200 Gbit/s is 400 GB/s.
        """
        return self.efa_gbps_per_node.value / 8

    @property
    def expected_allreduce_busbw_gbps(self) -> float:
        """What the network pre-flight expects at least: nominal bus bandwidth x EXPECTED_BUSBW_FRACTION."""
        return self.nominal_allreduce_busbw_gbps * EXPECTED_BUSBW_FRACTION


#: The share of the nominal inter-node bus bandwidth a healthy cluster reaches in the pre-flight's
#: 1 GiB all-reduce. nccl-tests' all_reduce_perf on p5.48xlarge (3,200 Gbit/s EFA, nominal
#: 400 GB/s; crazyguitar/aws-gpu-communication-benchmark, data/nccl_all_reduce.csv, NCCL over
#: aws-ofi-nccl on SageMaker HyperPod) reaches, at 1 GiB, 435 GB/s on 2 nodes, 280 on 4, 274 on 8,
#: 269 on 16 and 220 on 32: half the nominal figure lies below every one of them. Other EFA
#: generations are assumed to reach the same share of their own nominal bandwidth. Below it the
#: pre-flight warns with the figure; it refuses only a broken transport (TCP sockets, no EFA).
EXPECTED_BUSBW_FRACTION = 0.5

#: NCCL/libfabric settings of EFA instance types. The image installs the EFA user space
#: (libfabric, aws-ofi-nccl); these make NCCL load that plugin and libfabric use EFA.
EFA_NETWORK_ENVIRONMENT: dict[str, str] = {
    # libfabric: the EFA provider only (no silent fallback to its TCP provider).
    "FI_PROVIDER": "efa",
    # GPUDirect RDMA: EFA reads/writes GPU memory directly (P4de, P5, P5en, P6 support it).
    "FI_EFA_USE_DEVICE_RDMA": "1",
    # Data-loader workers fork after EFA registered memory; keep the fork safe.
    "FI_EFA_FORK_SAFE": "1",
    # EFA installer >= 1.44 names the plugin libnccl-net-ofi.so: NCCL loads libnccl-net-<this>.so.
    "NCCL_NET_PLUGIN": "ofi",
}


NVIDIA_B200_DATASHEET = "NVIDIA HGX B200 datasheet (dense = half the sparse figure)"
NVIDIA_H200_DATASHEET = "NVIDIA H200 Tensor Core GPU datasheet (SXM, dense)"
NVIDIA_H100_DATASHEET = "NVIDIA H100 Tensor Core GPU datasheet (SXM, dense)"
NVIDIA_A100_DATASHEET = "NVIDIA A100 Tensor Core GPU datasheet (dense)"
CALIBRATION_DOC = "btk calibration, docs/calibration.md"
CALIBRATION_FIT = "benchmarks/calibrate.py fit to the published runs of docs/calibration.md (this GPU's family)"
ATTENTION_ASSUMED_HOPPER = "assumed equal to Hopper's fit: no published B200 run varies the sequence length"
HOPPER_FIT: dict[str, Fact] = {
    "achieved_matmul_fraction": Fact(0.6744, CALIBRATION_FIT, "2026-12"),
    "non_matmul_overhead": Fact(1.49, CALIBRATION_FIT, "2026-12"),
    "attention_efficiency": Fact(0.254, CALIBRATION_FIT, "2026-12"),
}
"""The Hopper family's fitted efficiency (H100 and H200 share it; B200 borrows its attention efficiency)."""

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
    achieved_matmul_fraction=Fact(0.5562, CALIBRATION_FIT, "2026-12"),
    non_matmul_overhead=Fact(1.019, CALIBRATION_FIT, "2026-12"),
    attention_efficiency=Fact(HOPPER_FIT["attention_efficiency"].value, ATTENTION_ASSUMED_HOPPER, "2026-12"),
    compute_capability=(10, 0),
)

ASSUMED_B200_FIT = "assumed equal to B200's fit: no published training run on this GPU is in docs/calibration.md"


def _efficiency_assumed_from_b200() -> dict[str, Fact]:
    """B200's fitted efficiency facts, marked as estimates, for a Blackwell GPU without published runs."""
    return {
        field: Fact(getattr(B200, field).value, ASSUMED_B200_FIT, "2026-12", estimate=True)
        for field in ("achieved_matmul_fraction", "non_matmul_overhead", "attention_efficiency")
    }


def _same_peak_for_every_fp8_recipe(bf16: Fact, fp8: Fact) -> dict[str, Fact]:
    """Dense peaks where tensorwise, rowwise and MXFP8 scaling all run at the GPU's FP8 rate."""
    return {"bf16": bf16, "fp8_tensorwise": fp8, "fp8_rowwise": fp8, "mxfp8": fp8}
B300_PER_GPU = (
    "Verda 'NVIDIA GB300 NVL72: GPU Architecture & Performance', per-GPU dense table, B300 column; NVIDIA HGX B300: "
    "72 PFLOPS FP8 and 36 PFLOPS BF16 (sparse) over 8 GPUs"
)
GB200_PER_GPU = (
    "NVIDIA's GB200 figures at 1,200 W (glennklockwood.com/garden/processors/B200, dense column); AWS P6e-GB200 "
    "UltraServers: 360 PFLOPS dense FP8 over 72 GPUs"
)

B300 = GpuSpec(
    name="NVIDIA B300",
    architecture="blackwell",
    hbm_gib=Fact(268.6, "nvidia-smi on B300 SXM6 AC: 275,040 MiB per GPU (NVIDIA: 288 GB HBM3e)", "2026-09"),
    hbm_bandwidth_tbps=Fact(8.0, "Hugging Face / AWS 'infrastructure for foundation model training': B300 288 GB "
                            "HBM3e at 8 TB/s (Verda's table: 7.7 TB/s)", "2026-06", estimate=True),
    dense_tflops=_same_peak_for_every_fp8_recipe(
        bf16=Fact(2250.0, B300_PER_GPU + ": B300 FP16/BF16 2.25 PFLOPS dense", "2026-06"),
        fp8=Fact(4500.0, B300_PER_GPU + ": B300 FP8 4.5 PFLOPS dense", "2026-06"),
    ),
    nvlink_gbps_per_direction=Fact(900.0, "NVLink 5: 1.8 TB/s bidirectional per GPU", "2026-06"),
    **_efficiency_assumed_from_b200(),
    compute_capability=(10, 3),
    evidence_family="blackwell-ultra",
)

# The B200 of a GB200 superchip (NVL72, liquid-cooled, 1,200 W): more HBM reported and an ~11 % higher
# clock than the HGX B200 of P6-B200.
GB200 = GpuSpec(
    name="NVIDIA GB200",
    architecture="blackwell",
    hbm_gib=Fact(185.0, "nvidia-smi on GB200 (NVL72): 189,471 MiB per GPU (NVIDIA: 186 GB HBM3e)", "2026-06"),
    hbm_bandwidth_tbps=Fact(8.0, "NVIDIA GB200 NVL72: 576 TB/s HBM3e over 72 GPUs", "2025-07"),
    dense_tflops=_same_peak_for_every_fp8_recipe(
        bf16=Fact(2500.0, GB200_PER_GPU, "2025-07"), fp8=Fact(5000.0, GB200_PER_GPU, "2025-07")
    ),
    nvlink_gbps_per_direction=Fact(900.0, "NVLink 5: 1.8 TB/s bidirectional per GPU, across the NVL72 domain",
                                   "2025-07"),
    **_efficiency_assumed_from_b200(),
    compute_capability=(10, 0),
    evidence_family="grace-blackwell",
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
    achieved_matmul_fraction=HOPPER_FIT["achieved_matmul_fraction"],
    non_matmul_overhead=HOPPER_FIT["non_matmul_overhead"],
    attention_efficiency=HOPPER_FIT["attention_efficiency"],
    compute_capability=(9, 0),
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
    achieved_matmul_fraction=HOPPER_FIT["achieved_matmul_fraction"],
    non_matmul_overhead=HOPPER_FIT["non_matmul_overhead"],
    attention_efficiency=HOPPER_FIT["attention_efficiency"],
    compute_capability=(9, 0),
)

A100_80GB = GpuSpec(
    name="NVIDIA A100 80GB",
    architecture="ampere",
    hbm_gib=Fact(80.0, "nvidia-smi on A100 SXM 80GB: 81,920 MiB", "2023-06"),
    hbm_bandwidth_tbps=Fact(2.039, NVIDIA_A100_DATASHEET, "2023-06"),
    dense_tflops={"bf16": Fact(312.0, NVIDIA_A100_DATASHEET, "2023-06")},
    nvlink_gbps_per_direction=Fact(300.0, "NVLink 3: 600 GB/s bidirectional per GPU", "2023-06"),
    achieved_matmul_fraction=Fact(0.8304, CALIBRATION_FIT, "2026-12"),
    non_matmul_overhead=Fact(1.105, CALIBRATION_FIT, "2026-12"),
    attention_efficiency=Fact(0.3611, CALIBRATION_FIT, "2026-12"),
    compute_capability=(8, 0),
)

# Reference GPU of llm-foundry's A100 40GB benchmark table (a calibration run, not a catalog instance).
A100_40GB = GpuSpec(
    name="NVIDIA A100 40GB",
    architecture="ampere",
    hbm_gib=Fact(40.0, "NVIDIA A100 Tensor Core GPU datasheet: 40 GB HBM2 (SXM)", "2023-06"),
    hbm_bandwidth_tbps=Fact(1.555, "NVIDIA A100 Tensor Core GPU datasheet: 1,555 GB/s (40 GB SXM)", "2023-06"),
    dense_tflops=A100_80GB.dense_tflops,
    nvlink_gbps_per_direction=A100_80GB.nvlink_gbps_per_direction,
    achieved_matmul_fraction=A100_80GB.achieved_matmul_fraction,
    non_matmul_overhead=A100_80GB.non_matmul_overhead,
    attention_efficiency=A100_80GB.attention_efficiency,
    compute_capability=(8, 0),
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
    attention_efficiency=H100.attention_efficiency,
    compute_capability=(9, 0),
)

PRICE_NOTE = "AWS on-demand list price, us-east-1, approximate; verify before budgeting"
P6_B200_USD_PER_HOUR = 113.93
"""ml.p6-b200.48xlarge's on-demand estimate (:data:`PRICE_NOTE`); B300 and GB200 instances are priced at its rate
per GPU until AWS lists theirs (:func:`_at_b200_rate_per_gpu`)."""
P6_B200_USD_PER_GPU_HOUR = P6_B200_USD_PER_HOUR / 8
PRICE_ASSUMED_PER_GPU = (
    f"no AWS list price found: P6-B200's per-GPU estimate (USD {P6_B200_USD_PER_GPU_HOUR:.2f} per GPU-hour) "
    "assumed; verify before budgeting"
)


def _at_b200_rate_per_gpu(gpus: int) -> Fact:
    """The hourly price of an instance of ``gpus`` GPUs at P6-B200's estimate per GPU (no AWS list price)."""
    return Fact(round(P6_B200_USD_PER_GPU_HOUR * gpus, 2), PRICE_ASSUMED_PER_GPU, "2026-12", estimate=True)

ULTRASERVER_SOURCE = (
    "AWS P6e-GB200 UltraServers: 36 or 72 GPUs in one NVLink domain, 4 GPUs per p6e-gb200.36xlarge instance; "
    "SageMaker API reference, UltraServerType (e.g. ml.u-p6e-gb200x72)"
)

INSTANCE_TYPES: dict[str, InstanceType] = {
    instance.name: instance
    for instance in (
        InstanceType(
            "ml.p6-b200.48xlarge",
            B200,
            8,
            efa_gbps_per_node=Fact(3200.0, "AWS P6-B200 instance page: 3.2 Tbps EFAv4", "2025-05"),
            usd_per_hour=Fact(P6_B200_USD_PER_HOUR, PRICE_NOTE, "2025-06", estimate=True),
            aliases=("p6-b200", "b200"),
            managed_spot=Offer(
                False,
                "AWS sells P6-B200 through Capacity Blocks / SageMaker training plans; no spot market at launch "
                "(gpueconomics.com 'Understanding AWS Capacity Blocks for GPUs'); SageMaker lists no "
                "'ml.p6-b200.48xlarge for spot training job usage' quota",
                "2025-06",
            ),
            network_environment=EFA_NETWORK_ENVIRONMENT,
        ),
        InstanceType(
            "ml.p6-b300.48xlarge",
            B300,
            8,
            efa_gbps_per_node=Fact(6400.0, "AWS P6-B300: 6.4 Tbps EFAv4 per instance (8 x 800 Gbps)", "2026-06"),
            usd_per_hour=_at_b200_rate_per_gpu(8),
            aliases=("p6-b300", "b300"),
            network_environment=EFA_NETWORK_ENVIRONMENT,
        ),
        InstanceType(
            "ml.p6e-gb200.36xlarge",
            GB200,
            4,
            efa_gbps_per_node=Fact(
                1600.0, "AWS P6e-GB200 UltraServers: 28.8 Tbps EFAv4 per 72-GPU UltraServer, 18 instances", "2025-07"
            ),
            usd_per_hour=_at_b200_rate_per_gpu(4),
            aliases=("p6e-gb200", "gb200"),
            network_environment=EFA_NETWORK_ENVIRONMENT,
            cpu_architecture="arm64",
            ultraservers=(
                UltraServer("ml.u-p6e-gb200x72", 18, ULTRASERVER_SOURCE, "2025-07"),
                UltraServer("ml.u-p6e-gb200x36", 9, ULTRASERVER_SOURCE, "2025-07"),
            ),
        ),
        InstanceType(
            "ml.p5en.48xlarge",
            H200,
            8,
            efa_gbps_per_node=Fact(3200.0, "AWS P5en instance page: 3.2 Tbps EFAv3", "2024-09"),
            usd_per_hour=Fact(63.30, PRICE_NOTE, "2025-06", estimate=True),
            aliases=("p5en", "h200"),
            network_environment=EFA_NETWORK_ENVIRONMENT,
        ),
        InstanceType(
            "ml.p5.48xlarge",
            H100,
            8,
            efa_gbps_per_node=Fact(3200.0, "AWS P5 instance page: 3.2 Tbps EFAv2", "2023-07"),
            usd_per_hour=Fact(55.04, PRICE_NOTE, "2025-06", estimate=True),
            aliases=("p5", "h100"),
            managed_spot=Offer(
                True, "Service Quotas, Amazon SageMaker: 'ml.p5.48xlarge for spot training job usage'", "2025-06"
            ),
            network_environment=EFA_NETWORK_ENVIRONMENT,
            collectives=EFA_COLLECTIVES,
        ),
        InstanceType(
            "ml.p4de.24xlarge",
            A100_80GB,
            8,
            efa_gbps_per_node=Fact(400.0, "AWS P4de instance page: 400 Gbps EFA", "2022-05"),
            usd_per_hour=Fact(27.45, PRICE_NOTE, "2025-06", estimate=True),
            aliases=("p4de", "a100"),
            network_environment=EFA_NETWORK_ENVIRONMENT,
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
