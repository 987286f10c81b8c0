"""The calibration set and the fit of the throughput model's constants to it.

``calibration_points.json`` (next to this module) holds published measurements, each with
its source, the model it trained (``models``: Llama 3.1 8B and 70B, Llama 2 7B to 70B, MPT 760M
to 70B, OLMo 2 1B to 13B), its system, its knobs and what differs from btk's trainer. This
module loads them, predicts each with the planner's own models, fits the fitted constants
(least squares on the log of tokens/s, Levenberg-Marquardt, no dependencies) and measures
how well the fit predicts runs it has not seen.

**Leave-source-out.** Runs of one source share its setup (software, cluster, the way it was
measured), so a fit that saw a run's twins flatters it. :func:`leave_source_out` predicts
each run by a fit without *every* run of its source: the same document and measurement
campaign (:func:`source_of`; a document holding tables from different clusters, as
llm-foundry's benchmark README does for H100, A100 80GB and A100 40GB, is one source per
table). Those errors make the error band the planner prints (``btk.planner.band``).

Two constants describe the *evidence*, not btk's trainer, and are fitted with the others:

* ``megatron_engine``: Megatron-Core with Transformer Engine runs the same model faster
  than an FSDP2 + torch.compile trainer (fused kernels, cuDNN attention, overlapped
  communication). NVIDIA publishes full-power B200 results only from Megatron, so they
  enter as ``prediction × megatron_engine``; the factor is pinned by the GPU family that has
  both engines' runs (Hopper), and assumed to hold on every GPU family. Megatron reduces
  gradients once per step, not after every micro-batch as the trainer's FSDP2 does.
* ``power_limit``: torchao's B200 runs were made on power-limited GPUs; their predictions
  are ``prediction × power_limit``, while SageMaker's p6-b200 runs at full power.

When the source left out is the only one with runs that need such a constant, the fit
without it knows nothing of the constant but the prior: the error printed for those runs
says how far the prior is from the truth, and it counts in the band, because that is how
much the planner's figure for such a GPU rests on that one source.

One constant describes the memory *evidence*: ``default_allocator_reserve``. The memory model
predicts what a step allocates at its peak; the published figure is the caching allocator's
peak *reserved* memory. With ``expandable_segments`` (torchtitan's ``run_train.sh``, torchao's
benchmark scripts, btk's trainer) the allocator grows segments in place and reserved memory
stays close to allocated; runs launched with the default allocator (``allocator`` in the file)
also hold fragmented cached blocks, so their predictions are ``allocated × (1 + reserve)``.
The reserve is the geometric-mean excess of those runs over the model, fitted like the rest:
a point's leave-one-out memory prediction uses the reserve fitted to the *other* such runs.
The planner's own predictions never include it: the trainer always runs with expandable segments.

A weak prior (``PRIOR_WEIGHT``) pulls every constant towards a neutral value so that every
fit stays defined when the runs left out were the only ones pinning a constant.

``held_out`` in the file: published runs of the same kinds that no fit ever sees, predicted
by the full fit (``benchmarks/calibrate.py`` prints their errors; ``docs/calibration.md``
lists them).
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
from btk.profile import ModelArchitecture

POINTS_FILE = Path(__file__).with_name("calibration_points.json")
PRIOR_WEIGHT = 0.02
GPU_FAMILIES = {
    "hopper": ("H100", "H200", "H100_96GB_GRAND_TETON"),
    "blackwell": ("B200",),
    "ampere": ("A100_80GB", "A100_40GB"),
    "grace-blackwell": ("GB200",),
}
ASSUMED_FROM = {"grace-blackwell": "blackwell"}
"""Families no fit sees (their runs are held out), predicted with another family's fitted constants: the
catalog's own assumption (``btk.hardware``: GB200's efficiency is B200's)."""
FAMILIES = tuple(family for family in GPU_FAMILIES if family not in ASSUMED_FROM)
ATTENTION_FAMILY = {"hopper": "hopper", "blackwell": "hopper", "ampere": "ampere"}
"""Whose attention efficiency a family uses: no published B200 run varies the sequence length."""
ATTENTION_FAMILIES = tuple(dict.fromkeys(ATTENTION_FAMILY.values()))
MEGATRON_ENGINE = 1.501
B200_POWER_LIMIT = 0.5994


@dataclass(frozen=True)
class CalibrationPoint:
    """One published measurement, the model it trained and the system it ran on."""

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
    model: str
    architecture: ModelArchitecture
    campaign: str | None = None
    """The table (measurement campaign) of the source document, where one document holds several."""
    allocator: str = "expandable_segments"
    """The CUDA caching allocator setting the run was launched with (``default`` or ``expandable_segments``)."""

    @property
    def parameters(self) -> int:
        return self.architecture.parameter_count

    @property
    def gpus(self) -> int:
        return self.nodes * self.system.gpus_per_node


@dataclass(frozen=True)
class Parameters:
    """Every fitted constant: per GPU family, the model's global ones, and the evidence's."""

    fraction: dict[str, float]
    overhead: dict[str, float]
    attention: dict[str, float]
    """Per family that has sequence sweeps (:data:`ATTENTION_FAMILY` maps each family to one)."""
    constants: ThroughputConstants
    megatron_engine: float
    power_limit: float


def family_of(gpu_key: str) -> str:
    return next(family for family, keys in GPU_FAMILIES.items() if gpu_key in keys)


def _system(spec: dict[str, Any]) -> tuple[InstanceType, str]:
    gpu: GpuSpec = getattr(hardware, spec["gpu"])
    network = spec.get("network_gbps_per_gpu") or 0
    domain = spec.get("nvlink_domain_nodes")  # nodes (compute trays) one NVLink domain joins, where it is more than one
    instance = InstanceType(
        name=spec["gpu"],
        gpu=gpu,
        gpus_per_node=spec["gpus_per_node"],
        efa_gbps_per_node=Fact(float(network * spec["gpus_per_node"]), spec["note"], "published"),
        usd_per_hour=Fact(0.0, "not a rentable instance", "published", estimate=True),
        ultraservers=(hardware.UltraServer(spec["gpu"], domain, spec["note"], "published"),) if domain else (),
    )
    return instance, family_of(spec["gpu"])


def _architecture(spec: dict[str, Any]) -> ModelArchitecture:
    return ModelArchitecture.model_validate({key: value for key, value in spec.items() if key != "source"})


def _points(data: dict[str, Any], key: str) -> tuple[CalibrationPoint, ...]:
    systems = {name: (*_system(spec), bool(spec.get("power_limited"))) for name, spec in data["systems"].items()}
    models = {name: _architecture(spec) for name, spec in data["models"].items()}
    points = []
    for raw in data[key]:
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
                model=raw["model"],
                architecture=models[raw["model"]],
                campaign=raw.get("campaign"),
                allocator=raw.get("allocator", "expandable_segments"),
            )
        )
    return tuple(points)


@cache
def _data() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(POINTS_FILE.read_text())
    return data


@cache
def load_points() -> tuple[CalibrationPoint, ...]:
    """The calibration set, in the file's order."""
    return _points(_data(), "points")


@cache
def load_held_out() -> tuple[CalibrationPoint, ...]:
    """Published runs no fit sees, to check the fit on."""
    return _points(_data(), "held_out")


def current_parameters() -> Parameters:
    """The constants the planner uses now (``btk.hardware`` and ``throughput.FITTED_CONSTANTS``)."""
    gpus = {"hopper": hardware.H100, "blackwell": hardware.B200, "ampere": hardware.A100_80GB}
    return Parameters(
        fraction={family: gpu.achieved_matmul_fraction.value for family, gpu in gpus.items()},
        overhead={family: gpu.non_matmul_overhead.value for family, gpu in gpus.items()},
        attention={family: gpus[family].attention_efficiency.value for family in ATTENTION_FAMILIES},
        constants=FITTED_CONSTANTS,
        megatron_engine=MEGATRON_ENGINE,
        power_limit=B200_POWER_LIMIT,
    )


def predict_tokens_per_second(point: CalibrationPoint, params: Parameters) -> float:
    """The published tokens/s/GPU as the model predicts it, engine and power limit included."""
    family = ASSUMED_FROM.get(point.family, point.family)
    gpu = dataclasses.replace(
        point.system.gpu,
        achieved_matmul_fraction=Fact(params.fraction[family], "fit", "fit"),
        non_matmul_overhead=Fact(params.overhead[family], "fit", "fit"),
        attention_efficiency=Fact(params.attention[ATTENTION_FAMILY[family]], "fit", "fit"),
    )
    system = dataclasses.replace(point.system, gpu=gpu)
    megatron = point.engine == "megatron"
    tokens = estimate_throughput(
        point.architecture, point.knobs, system, point.nodes, params.constants, reduce_every_micro_batch=not megatron
    ).tokens_per_second_per_gpu
    if megatron:
        tokens *= params.megatron_engine
    if point.power_limited:
        tokens *= params.power_limit
    return tokens


def predict_allocated_gib(point: CalibrationPoint) -> float:
    """Peak allocated memory as the memory model predicts it (the model itself has no fitted constant)."""
    system = point.system
    return estimate_memory(point.architecture, point.knobs, system.gpus_per_node, point.nodes, system.hbm_gib,
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
    *(f"{family}.{kind}" for family in FAMILIES for kind in ("fraction", "overhead")),
    *(f"{family}.attention" for family in ATTENTION_FAMILIES),
    "eager_overhead_factor",
    "gemm_half_efficiency",
    "communication_interference",
    "fp8_tensorwise",
    "fp8_rowwise",
    "mxfp8",
    "megatron_engine",
    "power_limit",
)
NEUTRAL = (
    *(value for _ in FAMILIES for value in (0.6, 1.0)),
    *(0.5 for _ in ATTENTION_FAMILIES),
    1.0,
    4.0e6,
    0.1,
    1.0,
    1.0,
    1.0,
    1.0,
    1.0,
)


def _to_vector(params: Parameters) -> list[float]:
    c = params.constants
    per_family = [value for family in FAMILIES for value in (params.fraction[family], params.overhead[family])]
    return [
        *per_family,
        *(params.attention[family] for family in ATTENTION_FAMILIES),
        c.eager_overhead_factor,
        max(c.gemm_half_efficiency, 1.0),
        max(c.communication_interference, 1e-4),
        c.cast_cost["fp8_tensorwise"],
        c.cast_cost["fp8_rowwise"],
        c.cast_cost["mxfp8"],
        params.megatron_engine,
        params.power_limit,
    ]


def _from_vector(values: Sequence[float]) -> Parameters:
    v = dict(zip(NAMES, values, strict=True))
    return Parameters(
        fraction={family: v[f"{family}.fraction"] for family in FAMILIES},
        overhead={family: v[f"{family}.overhead"] for family in FAMILIES},
        attention={family: v[f"{family}.attention"] for family in ATTENTION_FAMILIES},
        constants=ThroughputConstants(
            eager_overhead_factor=v["eager_overhead_factor"],
            gemm_half_efficiency=v["gemm_half_efficiency"],
            communication_interference=v["communication_interference"],
            cast_cost={"bf16": 0.0, **{recipe: v[recipe] for recipe in ("fp8_tensorwise", "fp8_rowwise", "mxfp8")}},
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
    residuals: Callable[[list[float]], list[float]], start: list[float], iterations: int = 60
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
    """One point's prediction by the full fit and by the fit without its whole source."""

    point: CalibrationPoint
    fitted_tokens: float
    left_out_tokens: float
    """Predicted by a fit to every *other* source's runs (:func:`leave_source_out`)."""
    memory_gib: float | None
    """Predicted published memory, the default-allocator reserve fitted without this point (leave-one-out)."""

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


def source_of(point: CalibrationPoint) -> str:
    """The source a point shares its setup with: its document, and its table where a document holds several."""
    document = source_document(point)
    return f"{document} ({point.campaign})" if point.campaign else document


def leave_source_out(
    points: Sequence[CalibrationPoint], params: Parameters
) -> dict[str, float]:
    """Each point's tokens/s relative error when every run of its source is left out of the fit."""
    errors: dict[str, float] = {}
    for source in dict.fromkeys(source_of(point) for point in points):
        kept = [point for point in points if source_of(point) != source]
        without = fit(kept, start=params)
        for point in points:
            if source_of(point) == source:
                errors[point.id] = predict_tokens_per_second(point, without) / point.tokens_per_second_per_gpu - 1
    return errors


def evaluate(points: Sequence[CalibrationPoint], params: Parameters) -> list[PointResult]:
    """Each point predicted by ``params`` and by a fit without its source; memory leave-one-out."""
    left_out = leave_source_out(points, params)
    results = []
    for index, point in enumerate(points):
        others = [p for i, p in enumerate(points) if i != index]
        reserve = fit_default_allocator_reserve(others)
        memory = predict_memory_gib(point, reserve) if point.memory_gib is not None else None
        fitted = predict_tokens_per_second(point, params)
        results.append(
            PointResult(
                point=point,
                fitted_tokens=fitted,
                left_out_tokens=(1 + left_out[point.id]) * point.tokens_per_second_per_gpu,
                memory_gib=memory,
            )
        )
    return results
