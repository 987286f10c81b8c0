"""Multi-node cost: collectives between nodes on the measured EFA fabric, overlap bounded by compute, and
tokens/s per GPU that falls with the node count as published multi-node runs fell.

External truth used here:

* nccl-tests all_reduce_perf on p5.48xlarge (crazyguitar/aws-gpu-communication-benchmark,
  data/nccl_all_reduce.csv): bus bandwidth by node count and message size;
* torchtitan's Llama 3.1 8B on 8 and on 128 H100 at the same local batch
  (benchmarks/llama3_h100_202412_torchtitan.md, tables 1 and 3) and Trainy's on 4 and 8 H200
  nodes (benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md), read from the calibration set.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from btk.hardware import INSTANCE_TYPES, get_instance_type
from btk.hf_import import profile_from_config
from btk.knobs import TrainingKnobs
from btk.planner.calibration import current_parameters, load_points, predict_tokens_per_second, source_document
from btk.planner.search import evaluate_knobs, plan_profile
from btk.planner.throughput import Collective, gradient_accumulation_for, layer_communication
from btk.profile import ModelProfile

HF_CONFIGS = Path(__file__).resolve().parents[1] / "hf_configs"
P5 = get_instance_type("ml.p5.48xlarge")

# (nodes, message MiB, published bus bandwidth GB/s) rows of data/nccl_all_reduce.csv
NCCL_ALL_REDUCE_P5 = [(4, 1024, 280.30), (8, 4096, 351.32), (16, 1024, 269.23), (32, 8192, 321.10), (32, 256, 137.99)]


@pytest.mark.parametrize(("nodes", "mib", "busbw"), NCCL_ALL_REDUCE_P5)
def test_collectives_between_p5_nodes_take_what_nccl_tests_measured(nodes: int, mib: int, busbw: float) -> None:
    """An all-reduce of every GPU of ``nodes`` p5 nodes, predicted within 25 % of the measured time."""
    group = Collective(ranks=8 * nodes, ranks_per_node=8)
    size = mib * 2**20
    bus_bytes = 2 * size * (group.ranks - 1) / group.ranks
    predicted = group.latency_seconds(P5) + group.transfer_seconds(P5, bus_bytes)
    measured = bus_bytes / (busbw * 1e9)
    assert predicted == pytest.approx(measured, rel=0.25)


def test_inside_a_node_nvlink_carries_the_collective_and_across_nodes_the_network() -> None:
    p4de = get_instance_type("ml.p4de.24xlarge")
    inside, across = Collective(8, 8), Collective(16, 8)
    assert inside.latency_seconds(p4de) == 0.0 and across.latency_seconds(p4de) > 0.0
    # 400 Gbit/s EFA per p4de node against 300 GB/s NVLink per GPU: the network is far slower
    assert across.transfer_seconds(p4de, 1e9) > 5 * inside.transfer_seconds(p4de, 1e9)
    # one rank per node (HSDP replicas, 2 nodes as ``across``) gets an eighth of the node's network
    assert Collective(2, 1).transfer_seconds(p4de, 1e9) == pytest.approx(8 * across.transfer_seconds(p4de, 1e9))


def test_hsdp_keeps_parameter_gathers_inside_the_node() -> None:
    profile = _nemo_12b()
    arch = profile.architecture
    knobs = TrainingKnobs(micro_batch_size=1, seq_len=8192, sharding="hybrid_shard")
    hybrid = layer_communication(arch, knobs, P5, 16)
    full = layer_communication(arch, knobs.model_copy(update={"sharding": "full_shard"}), P5, 16)
    assert hybrid.forward < full.forward  # NVLink all-gather against one across 16 nodes
    assert hybrid.tail > 0 and full.latency > hybrid.latency > 0


def _published_pairs() -> list[tuple[str, str]]:
    """Runs of one source that differ only in their node count: (fewer nodes, more nodes)."""
    points = load_points()
    pairs = []
    for few in points:
        for many in points:
            if source_document(few) == source_document(many) and few.knobs == many.knobs \
                    and few.system == many.system and few.nodes < many.nodes:
                pairs.append((few.id, many.id))
    return pairs


def test_the_calibration_holds_runs_at_several_node_counts() -> None:
    assert len(_published_pairs()) >= 4


@pytest.mark.parametrize(("few", "many"), _published_pairs())
def test_published_scaling_is_reproduced(few: str, many: str) -> None:
    """The drop in tokens/s per GPU from fewer to more nodes, as published, within 3 percentage points."""
    points = {point.id: point for point in load_points()}
    params = current_parameters()
    published = points[many].tokens_per_second_per_gpu / points[few].tokens_per_second_per_gpu
    predicted = predict_tokens_per_second(points[many], params) / predict_tokens_per_second(points[few], params)
    assert predicted < 1.0
    assert predicted == pytest.approx(published, abs=0.03)


def _nemo_12b() -> ModelProfile:
    """Mistral NeMo 12B as `btk profile import` reads its config.json (a 12B-class dense decoder)."""
    config = json.loads((HF_CONFIGS / "mistral-nemo-base-2407.json").read_text())
    return profile_from_config(config, "mistral-nemo-12b")


def _smallest_published_drop() -> float:
    """The least a published run lost per GPU going to more nodes at the same per-GPU work (a lower bound)."""
    points = {point.id: point for point in load_points()}
    return min(1 - points[many].tokens_per_second_per_gpu / points[few].tokens_per_second_per_gpu
               for few, many in _published_pairs())


@pytest.mark.parametrize("instance_name", list(INSTANCE_TYPES))
def test_the_same_knobs_on_64_nodes_are_slower_per_gpu_than_on_one(instance_name: str) -> None:
    """A 12B plan's knobs on 64 nodes lose at least what the published runs lost on fewer nodes.

    The published pairs kept the per-GPU batch; 64 nodes at the profile's global batch leave one
    micro-batch per GPU and step, so the loss can only be larger.
    """
    profile, instance = _nemo_12b(), INSTANCE_TYPES[instance_name]
    one = plan_profile(profile, instance, 1).evaluation
    knobs = one.knobs
    steps = gradient_accumulation_for(profile.training.global_batch_tokens, knobs.micro_batch_size, knobs.seq_len,
                                      64 * instance.gpus_per_node // knobs.tensor_parallel)
    wide = evaluate_knobs(profile, instance, 64, knobs.model_copy(update={"gradient_accumulation_steps": steps}))
    drop = 1 - wide.estimate.tokens_per_second_per_gpu / one.estimate.tokens_per_second_per_gpu
    assert drop >= _smallest_published_drop() > 0, (instance_name, drop)
    assert wide.estimate.exposed_communication_seconds > one.estimate.exposed_communication_seconds * steps / \
        knobs.gradient_accumulation_steps


def test_a_multi_node_plan_says_how_it_scales() -> None:
    from btk.planner.render import render_plan

    profile = _nemo_12b()
    plan = plan_profile(profile, P5, 8)
    one = plan_profile(profile, P5, 1)
    assert plan.scaling is not None and plan.scaling.one_node_tokens_per_second_per_gpu is not None
    assert plan.scaling.efficiency == pytest.approx(
        plan.evaluation.estimate.tokens_per_second_per_gpu / one.evaluation.estimate.tokens_per_second_per_gpu)
    document = plan.to_json()["scaling_vs_one_node"]
    assert document["nodes"] == 8 and document["efficiency"] == round(plan.scaling.efficiency, 4)
    assert f"scaling: {plan.scaling.efficiency:.1%} of the one-node plan's" in render_plan(plan)
    assert plan_profile(profile, P5, 1).scaling is None and one.to_json()["scaling_vs_one_node"] is None


@pytest.mark.parametrize("instance_name", list(INSTANCE_TYPES))
def test_a_12b_plan_on_64_nodes_trains_fewer_tokens_per_gpu_than_on_one(instance_name: str) -> None:
    """The planner's best plan for a 12B model on 64 nodes, whatever knobs it picks there, stays below the
    one-node plan by at least the smallest loss a published run showed on more nodes; so its "$ to train"
    grows with the node count."""
    profile, instance = _nemo_12b(), INSTANCE_TYPES[instance_name]
    one = plan_profile(profile, instance, 1)
    wide = plan_profile(profile, instance, 64)
    drop = 1 - wide.evaluation.estimate.tokens_per_second_per_gpu / one.evaluation.estimate.tokens_per_second_per_gpu
    assert drop >= _smallest_published_drop(), (instance_name, drop)
    assert wide.evaluation.estimate.exposed_communication_seconds > 0
    one_cost, wide_cost = one.training_cost(), wide.training_cost()
    assert one_cost is not None and wide_cost is not None and wide_cost.on_demand_usd > one_cost.on_demand_usd
    assert wide.scaling is not None and wide.scaling.efficiency == pytest.approx(1 - drop)
