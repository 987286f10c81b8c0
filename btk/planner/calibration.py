"""The calibration set and the fit of the throughput model's constants to it.

``calibration_points.json`` (next to this module) holds published measurements, each with
its source, its knobs and what differs from btk's trainer. This module loads them, predicts
each with the planner's own models, fits the fitted constants (least squares on the log
of tokens/s, Levenberg-Marquardt, no dependencies) and computes the leave-one-out error of
every point: the point is predicted by a fit to all *other* points.

Two constants describe the *evidence*, not btk's trainer, and are fitted with the others:

* ``megatron_engine``: Megatron-Core with Transformer Engine runs the same model faster
  than an FSDP2 + torch.compile trainer (fused kernels, cuDNN attention, overlapped
  communication). NVIDIA publishes full-power B200 results only from Megatron, so they
  enter as ``prediction × megatron_engine``; the factor is pinned by the GPU family that has
  both engines' runs (Hopper), and assumed to hold on every GPU family.
* ``power_limit``: torchao's B200 runs were made on power-limited GPUs; their predictions
  are ``prediction × power_limit``, while SageMaker's p6-b200 runs at full power.

One constant describes the memory *evidence*: ``default_allocator_reserve``. The memory model
predicts what a step allocates at its peak; the published figure is the caching allocator's
peak *reserved* memory. With ``expandable_segments`` (torchtitan's ``run_train.sh``, torchao's
benchmark scripts, btk's trainer) the allocator grows segments in place and reserved memory
stays close to allocated; runs launched with the default allocator (``allocator`` in the file)
also hold fragmented cached blocks, so their predictions are ``allocated × (1 + reserve)``.
The reserve is the geometric-mean excess of those runs over the model, fitted like the rest:
a point's leave-one-out memory prediction uses the reserve fitted to the *other* such runs.
The planner's own predictions never include it: the trainer always runs with expandable segments.

A weak prior (``PRIOR_WEIGHT``) pulls every constant towards a neutral value so that a
leave-one-out fit stays defined when the point left out was the only one pinning a constant.
Such a point (``pins`` in the file) cannot be predicted without itself: its leave-one-out
error measures the prior, not the model, so it is reported but left out of the error band
(``PointResult.predicted``). No point of the current set is one: the two Megatron DGX-H100
runs (two NeMo releases) pin ``megatron_engine`` together.

Runs of one source share its setup, so leave-one-out can flatter them (the two Megatron
DGX-H100 runs predict each other). :func:`leave_source_out` predicts each point by a fit
without *every* run of its source document, the harder test ``benchmarks/calibrate.py`` prints.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from btk import hardware
from btk.hardware import Fact, GpuSpec, InstanceType
from btk.knobs import TrainingKnobs
from btk.planner.memory import estimate_memory
from btk.planner.throughput import FITTED_CONSTANTS, ThroughputConstants, estimate_throughput
from btk.profile import ModelArchitecture, RopeScaling

POINTS_FILE = Path(__file__).with_name("calibration_points.json")
MEASURED_ARCHITECTURE = ModelArchitecture(
    num_layers=32,
    hidden_size=4096,
    num_attention_heads=32,
    num_kv_heads=8,
    ffn_hidden_size=14336,
    vocab_size=128256,
    max_context=131072,
    rope_theta=500000.0,
    rope_scaling=RopeScaling(
        factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
    ),
)
"""Llama 3.1 8B, the model every calibration point ran: part of the evidence, not of the user's ``profiles/``."""
PRIOR_WEIGHT = 0.02
GPU_FAMILIES = {"hopper": ("H100", "H200", "H100_96GB_GRAND_TETON"), "blackwell": ("B200",), "ampere": ("A100_80GB",)}
MEGATRON_ENGINE = 1.575
B200_POWER_LIMIT = 0.6407


@dataclass(frozen=True)
class CalibrationPoint:
    """One published measurement and the system it ran on."""

    id: str
    system: InstanceType
    family: str
    nodes: int
    engine: str
    power_limited: bool
    knobs: TrainingKnobs
    tokens_per_second_per_gpu: float
    memory_gib: float | None
    source: str
    differs: str
    pins: str | None = None
    """The constant only this point determines, and why (then it is evidence, not predicted)."""
    allocator: str = "expandable_segments"
    """The CUDA caching allocator setting the run was launched with (``default`` or ``expandable_segments``)."""


@dataclass(frozen=True)
class Parameters:
    """Every fitted constant: per GPU family, the model's global ones, and the evidence's."""

    fraction: dict[str, float]
    overhead: dict[str, float]
    constants: ThroughputConstants
    megatron_engine: float
    power_limit: float


def family_of(gpu_key: str) -> str:
    return next(family for family, keys in GPU_FAMILIES.items() if gpu_key in keys)


def _system(spec: dict[str, Any]) -> tuple[InstanceType, str]:
    gpu: GpuSpec = getattr(hardware, spec["gpu"])
    network = spec.get("network_gbps_per_gpu") or 0
    instance = InstanceType(
        name=spec["gpu"],
        gpu=gpu,
        gpus_per_node=spec["gpus_per_node"],
        efa_gbps_per_node=Fact(float(network * spec["gpus_per_node"]), spec["note"], "published"),
        usd_per_hour=Fact(0.0, "not a rentable instance", "published", estimate=True),
    )
    return instance, family_of(spec["gpu"])


@cache
def load_points() -> tuple[CalibrationPoint, ...]:
    """The calibration set, in the file's order."""
    data = json.loads(POINTS_FILE.read_text())
    systems = {name: (*_system(spec), bool(spec.get("power_limited"))) for name, spec in data["systems"].items()}
    points = []
    for raw in data["points"]:
        system, family, power_limited = systems[raw["system"]]
        points.append(
            CalibrationPoint(
                id=raw["id"],
                system=system,
                family=family,
                nodes=raw["nodes"],
                engine=raw["engine"],
                power_limited=power_limited,
                knobs=TrainingKnobs.model_validate(raw["knobs"]),
                tokens_per_second_per_gpu=float(raw["tokens_per_second_per_gpu"]),
                memory_gib=raw["memory_gib"],
                source=raw["source"],
                differs=raw["differs"],
                pins=raw.get("pins"),
                allocator=raw.get("allocator", "expandable_segments"),
            )
        )
    return tuple(points)


def current_parameters() -> Parameters:
    """The constants the planner uses now (``btk.hardware`` and ``throughput.FITTED_CONSTANTS``)."""
    return Parameters(
        fraction={
            "hopper": hardware.H100.achieved_matmul_fraction.value,
            "blackwell": hardware.B200.achieved_matmul_fraction.value,
        },
        overhead={
            "hopper": hardware.H100.non_matmul_overhead.value,
            "blackwell": hardware.B200.non_matmul_overhead.value,
        },
        constants=FITTED_CONSTANTS,
        megatron_engine=MEGATRON_ENGINE,
        power_limit=B200_POWER_LIMIT,
    )


def predict_tokens_per_second(point: CalibrationPoint, params: Parameters) -> float:
    """The published tokens/s/GPU as the model predicts it, engine and power limit included."""
    gpu = dataclasses.replace(
        point.system.gpu,
        achieved_matmul_fraction=Fact(params.fraction[point.family], "fit", "fit"),
        non_matmul_overhead=Fact(params.overhead[point.family], "fit", "fit"),
    )
    system = dataclasses.replace(point.system, gpu=gpu)
    arch = MEASURED_ARCHITECTURE
    tokens = estimate_throughput(arch, point.knobs, system, point.nodes, params.constants).tokens_per_second_per_gpu
    if point.engine == "megatron":
        tokens *= params.megatron_engine
    if point.power_limited:
        tokens *= params.power_limit
    return tokens


def predict_allocated_gib(point: CalibrationPoint) -> float:
    """Peak allocated memory as the memory model predicts it (the model itself has no fitted constant)."""
    arch = MEASURED_ARCHITECTURE
    system = point.system
    return estimate_memory(arch, point.knobs, system.gpus_per_node, point.nodes, system.hbm_gib,
                           whole_logits=True).total  # the published runs held their logits whole


def predict_memory_gib(point: CalibrationPoint, default_allocator_reserve: float) -> float:
    """The published peak reserved memory as predicted: allocated, plus the reserve of a default-allocator run."""
    allocated = predict_allocated_gib(point)
    return allocated * (1 + default_allocator_reserve) if point.allocator == "default" else allocated


def fit_default_allocator_reserve(points: Sequence[CalibrationPoint]) -> float:
    """Geometric-mean excess of the default-allocator runs' published memory over the model; 0 without such runs."""
    ratios = [
        math.log(point.memory_gib / predict_allocated_gib(point))
        for point in points
        if point.allocator == "default" and point.memory_gib is not None
    ]
    return math.exp(sum(ratios) / len(ratios)) - 1 if ratios else 0.0


# The fit works on the logarithms of these values; the prior pulls towards NEUTRAL.
NAMES = (
    "hopper.fraction",
    "hopper.overhead",
    "blackwell.fraction",
    "blackwell.overhead",
    "eager_overhead_factor",
    "gemm_half_efficiency",
    "communication_interference",
    "fp8_rowwise",
    "mxfp8",
    "megatron_engine",
    "power_limit",
)
NEUTRAL = (0.6, 0.3, 0.6, 0.3, 1.0, 4.0e6, 0.1, 1.0, 1.0, 1.0, 1.0)


def _to_vector(params: Parameters) -> list[float]:
    c = params.constants
    return [
        params.fraction["hopper"],
        params.overhead["hopper"],
        params.fraction["blackwell"],
        params.overhead["blackwell"],
        c.eager_overhead_factor,
        max(c.gemm_half_efficiency, 1.0),
        max(c.communication_interference, 1e-4),
        c.cast_cost["fp8_rowwise"],
        c.cast_cost["mxfp8"],
        params.megatron_engine,
        params.power_limit,
    ]


def _from_vector(values: Sequence[float]) -> Parameters:
    v = dict(zip(NAMES, values, strict=True))
    return Parameters(
        fraction={"hopper": v["hopper.fraction"], "blackwell": v["blackwell.fraction"]},
        overhead={"hopper": v["hopper.overhead"], "blackwell": v["blackwell.overhead"]},
        constants=ThroughputConstants(
            eager_overhead_factor=v["eager_overhead_factor"],
            gemm_half_efficiency=v["gemm_half_efficiency"],
            communication_interference=v["communication_interference"],
            cast_cost={"bf16": 0.0, "fp8_tensorwise": 1.0, "fp8_rowwise": v["fp8_rowwise"], "mxfp8": v["mxfp8"]},
        ),
        megatron_engine=v["megatron_engine"],
        power_limit=v["power_limit"],
    )


def _residuals(points: Sequence[CalibrationPoint], logs: Sequence[float]) -> list[float]:
    params = _from_vector([math.exp(x) for x in logs])
    errors = [math.log(predict_tokens_per_second(p, params) / p.tokens_per_second_per_gpu) for p in points]
    prior = [math.sqrt(PRIOR_WEIGHT) * (x - math.log(n)) for x, n in zip(logs, NEUTRAL, strict=True)]
    return errors + prior


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (the system is small and well-conditioned)."""
    n = len(rhs)
    a = [[*row, rhs[i]] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, n):
            f = a[r][col] / a[col][col]
            for c in range(col, n + 1):
                a[r][c] -= f * a[col][c]
    x = [0.0] * n
    for r in reversed(range(n)):
        x[r] = (a[r][n] - sum(a[r][c] * x[c] for c in range(r + 1, n))) / a[r][r]
    return x


def _least_squares(
    residuals: Callable[[list[float]], list[float]], start: list[float], iterations: int = 40
) -> list[float]:
    """Levenberg-Marquardt with a forward-difference Jacobian."""
    x, damping, step = start[:], 1e-3, 1e-5
    r = residuals(x)
    cost = sum(v * v for v in r)
    for _ in range(iterations):
        columns = []
        for j in range(len(x)):
            shifted = x[:]
            shifted[j] += step
            columns.append([(a - b) / step for a, b in zip(residuals(shifted), r, strict=True)])
        jtj = [[sum(ci * cj for ci, cj in zip(a, b, strict=True)) for b in columns] for a in columns]
        jtr = [sum(c * v for c, v in zip(col, r, strict=True)) for col in columns]
        improved = False
        while damping < 1e8:
            lhs = [[jtj[i][j] + (damping * jtj[i][i] if i == j else 0.0) for j in range(len(x))] for i in range(len(x))]
            delta = _solve(lhs, [-v for v in jtr])
            candidate = [a + d for a, d in zip(x, delta, strict=True)]
            r_new = residuals(candidate)
            new_cost = sum(v * v for v in r_new)
            if new_cost < cost:
                improved = cost - new_cost > 1e-12
                x, r, cost, damping = candidate, r_new, new_cost, damping / 3
                break
            damping *= 4
        if not improved:
            break
    return x


def fit(points: Sequence[CalibrationPoint], start: Parameters | None = None) -> Parameters:
    """The constants that best predict ``points`` (log tokens/s least squares plus the prior)."""
    initial = [math.log(v) for v in _to_vector(start or current_parameters())]
    logs = _least_squares(lambda x: _residuals(points, x), initial)
    return _from_vector([math.exp(x) for x in logs])


@dataclass(frozen=True)
class PointResult:
    """One point's prediction by the full fit and by the fit without it."""

    point: CalibrationPoint
    fitted_tokens: float
    left_out_tokens: float
    memory_gib: float | None
    """Predicted published memory, the default-allocator reserve fitted without this point (leave-one-out)."""

    @property
    def predicted(self) -> bool:
        """Whether the leave-one-out fit can predict the point (no constant rests on it alone)."""
        return self.point.pins is None

    @property
    def fitted_error(self) -> float:
        return self.fitted_tokens / self.point.tokens_per_second_per_gpu - 1

    @property
    def left_out_error(self) -> float:
        return self.left_out_tokens / self.point.tokens_per_second_per_gpu - 1

    @property
    def memory_error(self) -> float | None:
        if self.memory_gib is None or self.point.memory_gib is None:
            return None
        return self.memory_gib / self.point.memory_gib - 1


def source_document(point: CalibrationPoint) -> str:
    """The repository and file a point was published in (``github:owner/repo path``), under its current path."""
    repository, path = point.source.replace(",", " ").split()[:2]
    moved = re.search(r"\(now ([^)\s]+)\)", point.source)
    return f"{repository} {moved.group(1) if moved else path}"


def leave_source_out(points: Sequence[CalibrationPoint], params: Parameters) -> dict[str, float]:
    """Each point's tokens/s relative error when every run of its source document is left out of the fit."""
    errors: dict[str, float] = {}
    for document in dict.fromkeys(source_document(point) for point in points):
        kept = [point for point in points if source_document(point) != document]
        without = fit(kept, start=params)
        for point in points:
            if source_document(point) == document:
                errors[point.id] = predict_tokens_per_second(point, without) / point.tokens_per_second_per_gpu - 1
    return errors


def evaluate(points: Sequence[CalibrationPoint], params: Parameters) -> list[PointResult]:
    """Each point predicted by ``params`` and by a refit that leaves it out."""
    results = []
    for index, point in enumerate(points):
        others = [p for i, p in enumerate(points) if i != index]
        without = fit(others, start=params)
        reserve = fit_default_allocator_reserve(others)
        memory = predict_memory_gib(point, reserve) if point.memory_gib is not None else None
        results.append(
            PointResult(
                point=point,
                fitted_tokens=predict_tokens_per_second(point, params),
                left_out_tokens=predict_tokens_per_second(point, without),
                memory_gib=memory,
            )
        )
    return results
