"""P6-B300 and P6e-GB200 in the hardware catalog: each fact against its cited figure, the NVLink domain of an
UltraServer in the planner's collectives, and the error band of GPUs with no published run."""

from __future__ import annotations

import dataclasses
import re

import botocore.session
import fixture_catalog
import pytest

from btk.hardware import INSTANCE_TYPES, Fact, InstanceType, get_instance_type
from btk.planner.band import band_for
from btk.planner.search import longest_sequence_one_node, plan_profile
from btk.planner.throughput import layer_communication

B300 = get_instance_type("ml.p6-b300.48xlarge")
GB200 = get_instance_type("ml.p6e-gb200.36xlarge")
B200 = get_instance_type("ml.p6-b200.48xlarge")
NEW = (B300, GB200)


@pytest.fixture(autouse=True)
def _fixture_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    fixture_catalog.install(monkeypatch)


def _facts(instance: InstanceType) -> list[Fact]:
    gpu = instance.gpu
    return [gpu.hbm_gib, gpu.hbm_bandwidth_tbps, *gpu.dense_tflops.values(), gpu.nvlink_gbps_per_direction,
            gpu.achieved_matmul_fraction, gpu.non_matmul_overhead, gpu.attention_efficiency,
            instance.efa_gbps_per_node, instance.usd_per_hour]


def test_sagemaker_sells_every_catalog_instance_type_for_training_jobs_and_training_plans() -> None:
    """botocore's SageMaker model (AWS's own list) names each catalog type as a training and a plan instance type."""
    model = botocore.session.get_session().get_service_model("sagemaker")
    for shape in ("TrainingInstanceType", "ReservedCapacityInstanceType"):
        assert set(INSTANCE_TYPES) <= set(model.shape_for(shape).enum), shape


def test_every_new_fact_has_a_source_and_what_is_assumed_says_so() -> None:
    for instance in NEW:
        for fact in _facts(instance):
            assert fact.source and fact.date, instance.name
        gpu = instance.gpu
        # no AWS list price, no published training run: both are estimates, and say whose figure they take
        assert instance.usd_per_hour.estimate and "P6-B200" in instance.usd_per_hour.source
        # ... at B200's rate per GPU-hour, kept in step with it (to the cent the catalog writes)
        per_gpu = B200.usd_per_hour.value / B200.gpus_per_node
        assert instance.usd_per_hour.value == pytest.approx(per_gpu * instance.gpus_per_node, abs=0.005)
        assert f"{per_gpu:.2f}" in instance.usd_per_hour.source
        for fitted in (gpu.achieved_matmul_fraction, gpu.non_matmul_overhead, gpu.attention_efficiency):
            assert fitted.estimate and "B200's fit" in fitted.source
        assert gpu.family != B200.gpu.family  # their own error-band family: B200's runs do not speak for them


@pytest.mark.parametrize("instance", list(INSTANCE_TYPES.values()), ids=list(INSTANCE_TYPES))
def test_memory_is_the_nvidia_smi_reading_its_source_cites(instance: InstanceType) -> None:
    """``nvidia-smi``'s total in MiB, as the source quotes it, is the catalog's GiB (within a tenth)."""
    reading = re.search(r"([\d,]+) MiB", instance.gpu.hbm_gib.source)
    assert reading is not None, instance.gpu.hbm_gib.source
    assert instance.hbm_gib == pytest.approx(int(reading[1].replace(",", "")) / 1024, abs=0.1)


def test_gb200_adds_up_to_the_published_ultraserver() -> None:
    """AWS's u-p6e-gb200x72: 72 GPUs (18 instances of 4), 360 PFLOPS dense FP8, 28.8 Tbps of EFAv4."""
    largest = GB200.ultraserver()
    assert largest.name == "ml.u-p6e-gb200x72" and largest.instances * GB200.gpus_per_node == 72
    assert GB200.ultraserver("ml.u-p6e-gb200x36").instances * GB200.gpus_per_node == 36
    assert largest.instances * GB200.gpus_per_node * GB200.gpu.peak_tflops("mxfp8") == pytest.approx(360_000)
    assert largest.instances * GB200.efa_gbps_per_node.value == pytest.approx(28_800)
    assert GB200.cpu_architecture == "arm64" and B300.cpu_architecture == "x86_64"
    assert GB200.gpu.peak_tflops("bf16") * 2 == GB200.gpu.peak_tflops("fp8_rowwise")
    assert B300.gpu.compute_capability == (10, 3) and GB200.gpu.compute_capability == (10, 0)


def test_collectives_inside_an_ultraserver_run_over_nvlink_and_cross_efa_beyond_it() -> None:
    """16 GB200 instances share one NVLink domain: no network latency, NVLink's bandwidth; 32 need two."""
    arch = fixture_catalog.LLAMA_8B.architecture
    knobs = plan_profile(fixture_catalog.LLAMA_8B, GB200, 16).knobs
    without_domain = dataclasses.replace(GB200, ultraservers=())
    inside = layer_communication(arch, knobs, GB200, 16)
    over_efa = layer_communication(arch, knobs, without_domain, 16)
    assert inside.latency == 0 and over_efa.latency > 0
    assert inside.backward < over_efa.backward / 2  # 900 GB/s of NVLink per GPU against 200 GB/s of EFA
    beyond = layer_communication(arch, knobs, GB200, 32)
    assert beyond == layer_communication(arch, knobs, without_domain, 32)


def test_a_plan_on_a_gpu_without_published_runs_says_it_is_outside_the_evidence() -> None:
    profile = fixture_catalog.LLAMA_8B
    for instance in NEW:
        band = band_for(instance, profile.architecture.parameter_count, profile.training.seq_len, 1)
        assert not band.measured
        assert f"no published run on {instance.gpu.family} GPUs is fitted" in band.describe()
    assert band_for(B200, profile.architecture.parameter_count, profile.training.seq_len, 1).outside == ()


def test_more_memory_per_gpu_fits_longer_sequences_on_one_node() -> None:
    """B300's 268.6 GiB holds at least B200's longest sequence, for every profile."""
    for profile in fixture_catalog.PROFILES.values():
        assert longest_sequence_one_node(profile, B300) >= longest_sequence_one_node(profile, B200), profile.name
