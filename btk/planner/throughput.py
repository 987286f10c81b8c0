"""Step time, tokens/s per GPU, MFU and cost of one training configuration.

Model (per GPU, per optimizer step):

* **FLOPs.** Matmul FLOPs per token are ``6·N`` (forward 2N, backward 4N; Kaplan et al. 2020)
  with N the matmul parameters (blocks + output head, not the embedding lookup). Causal
  attention executes ``6·L·h·s`` FLOPs per token with flash attention (half of the
  ``12·L·h·s`` that the MFU convention below counts). Recompute adds the forward FLOPs that
  the checkpointing mode re-runs: ``selective`` re-runs wk, wo and w3; ``full`` re-runs the
  whole block forward including attention.
* **Compute time.** Linear-layer FLOPs run at the precision's dense peak (fp8/mxfp8 peaks
  for the block linears; the output head stays bf16, as torchao/torchtitan convert it), the
  rest at the bf16 peak. Achieved throughput is ``peak × achieved_matmul_fraction ×
  h/(h + 1024)``: the GPU's calibrated fraction (``btk.hardware``) scaled down for narrow
  models whose GEMMs cannot fill the GPU.
* **Float8 casts.** Dynamic scaling reads bf16 (twice: amax, then cast) and writes fp8 for
  the input and the output gradient of every converted linear, in both layouts:
  ``12·(in+out)`` bytes per token per linear at 70 % of HBM bandwidth, ×1.5 for rowwise and
  MXFP8 scaling (``CAST_COST_BY_PRECISION``).
* **Fixed per-micro-batch cost.** Kernel launches and FSDP hooks: 40 µs per layer compiled,
  120 µs eager, per micro-batch.
* **Communication.** FSDP all-gathers bf16 parameters in forward and again in backward for
  every micro-batch, and reduce-scatters fp32 gradients once per step; HSDP does the same
  inside a node and all-reduces its gradient shard across nodes; tensor parallelism
  all-reduces activations four times per layer per micro-batch. Bandwidths: NVLink inside a
  node, EFA per GPU across nodes (ring algorithms, 80 % of link rate). 85 % of FSDP traffic
  overlaps compute; TP traffic does not overlap.

**MFU** uses torchtitan's convention (``6·N + 12·L·h·s`` FLOPs per token against the dense
bf16 peak) so figures compare with published ones. Calibration: ``docs/calibration.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from btk.hardware import InstanceType
from btk.knobs import TrainingKnobs
from btk.planner.cost import tokens_billion
from btk.planner.memory import parallelism_for
from btk.profile import ModelArchitecture

WIDTH_HALF_EFFICIENCY = 1024
CAST_BANDWIDTH_FRACTION = 0.70
CAST_BYTES_PER_FEATURE = 12.0
# Relative cost of the dynamic-scaling casts: rowwise scales need a reduction per row and a
# second, column-wise cast for the backward pass; MXFP8 writes one e8m0 scale per 32 values
# in both layouts. Tensorwise is the reference.
CAST_COST_BY_PRECISION = {"bf16": 0.0, "fp8_tensorwise": 1.0, "fp8_rowwise": 1.5, "mxfp8": 1.5}
LINK_EFFICIENCY = 0.80
FSDP_OVERLAP = 0.85
LAYER_OVERHEAD_SECONDS = {True: 40e-6, False: 120e-6}


@dataclass(frozen=True)
class Estimate:
    """Predicted speed and cost (the ``estimate`` JSON object)."""

    tokens_per_second_per_gpu: float
    mfu: float
    step_seconds: float
    usd_per_billion_tokens: float
    tflops_per_gpu: float
    exposed_communication_seconds: float
    global_batch_tokens: int

    def as_json(self) -> dict[str, float]:
        return {
            "tokens_per_second_per_gpu": round(self.tokens_per_second_per_gpu, 1),
            "mfu": round(self.mfu, 4),
            "step_seconds": round(self.step_seconds, 3),
            "usd_per_billion_tokens": round(self.usd_per_billion_tokens, 2),
            "tflops_per_gpu": round(self.tflops_per_gpu, 1),
            "exposed_communication_seconds": round(self.exposed_communication_seconds, 3),
            "global_batch_tokens": self.global_batch_tokens,
        }


def model_flops_per_token(arch: ModelArchitecture, seq_len: int) -> float:
    """FLOPs per token by torchtitan's MFU convention: ``6·N + 12·L·h·s``."""
    return 6.0 * arch.matmul_parameters + 12.0 * arch.num_layers * arch.hidden_size * seq_len


def _linear_shapes(arch: ModelArchitecture) -> list[tuple[int, int]]:
    h, kv, f = arch.hidden_size, arch.kv_dim, arch.ffn_hidden_size
    return [(h, h), (h, kv), (h, kv), (h, h), (h, f), (h, f), (f, h)]


def recompute_flops_per_token(arch: ModelArchitecture, knobs: TrainingKnobs) -> tuple[float, float]:
    """Extra (linear, attention) forward FLOPs per token re-run by activation checkpointing."""
    h, kv, f, layers = arch.hidden_size, arch.kv_dim, arch.ffn_hidden_size, arch.num_layers
    if knobs.activation_checkpointing == "selective":
        return 2.0 * layers * (h * kv + h * h + h * f), 0.0
    if knobs.activation_checkpointing == "full":
        linear_block = sum(i * o for i, o in _linear_shapes(arch))
        return 2.0 * layers * linear_block, 2.0 * layers * h * knobs.seq_len
    return 0.0, 0.0


def _width_factor(arch: ModelArchitecture, knobs: TrainingKnobs) -> float:
    width = arch.hidden_size / knobs.tensor_parallel
    return width / (width + WIDTH_HALF_EFFICIENCY)


def compute_seconds_per_token(arch: ModelArchitecture, knobs: TrainingKnobs, instance: InstanceType) -> float:
    """Seconds of GPU work per token for one TP rank (matmuls, non-matmul work, fp8 casts)."""
    gpu = instance.gpu
    efficiency = gpu.achieved_matmul_fraction.value * _width_factor(arch, knobs)
    bf16_rate = gpu.peak_tflops("bf16") * 1e12 * efficiency
    linear_rate = gpu.peak_tflops(knobs.precision) * 1e12 * efficiency
    block_linear_params = arch.num_layers * sum(i * o for i, o in _linear_shapes(arch))
    head_params = arch.vocab_size * arch.hidden_size
    recompute_linear, recompute_attention = recompute_flops_per_token(arch, knobs)
    block_linear_flops = 6.0 * block_linear_params + recompute_linear
    other_flops = 6.0 * head_params + 6.0 * arch.num_layers * arch.hidden_size * knobs.seq_len + recompute_attention
    matmul_seconds = block_linear_flops / linear_rate + other_flops / bf16_rate
    # Non-matmul work (norms, RoPE, SwiGLU, residuals, optimizer, launch gaps) scales with the
    # bf16 matmul work and does not shrink with float8.
    bf16_seconds = (block_linear_flops + other_flops) / bf16_rate
    seconds = matmul_seconds + gpu.non_matmul_overhead.value * bf16_seconds
    if knobs.precision != "bf16":
        cast_bytes = CAST_BYTES_PER_FEATURE * arch.num_layers * sum(i + o for i, o in _linear_shapes(arch))
        cast_bytes *= CAST_COST_BY_PRECISION[knobs.precision]
        seconds += cast_bytes / (gpu.hbm_bandwidth_tbps.value * 1e12 * CAST_BANDWIDTH_FRACTION)
    return seconds / knobs.tensor_parallel


def communication_seconds_per_step(
    arch: ModelArchitecture, knobs: TrainingKnobs, instance: InstanceType, nodes: int
) -> tuple[float, float]:
    """(overlappable FSDP/HSDP seconds, non-overlapped TP seconds) per optimizer step."""
    par = parallelism_for(knobs, instance.gpus_per_node, nodes)
    tp = par.tensor_parallel
    params_local = arch.parameter_count / tp
    nvlink = instance.gpu.nvlink_gbps_per_direction.value * 1e9 * LINK_EFFICIENCY
    efa_per_gpu = instance.efa_gbps_per_node.value / 8 * 1e9 / instance.gpus_per_node * LINK_EFFICIENCY
    shard = par.shard_degree
    within_node = shard * tp <= instance.gpus_per_node
    shard_bandwidth = nvlink if within_node else efa_per_gpu
    ring = (shard - 1) / shard if shard > 1 else 0.0
    micro_batches = knobs.gradient_accumulation_steps
    all_gather = 2 * micro_batches * 2.0 * params_local * ring / shard_bandwidth
    reduce_scatter = 4.0 * params_local * ring / shard_bandwidth
    fsdp = all_gather + reduce_scatter
    replicas = par.data_parallel // shard
    if replicas > 1:  # HSDP / DDP gradient all-reduce across replicas (inter-node)
        fsdp += 2.0 * 4.0 * params_local / shard * (replicas - 1) / replicas / efa_per_gpu
    tp_seconds = 0.0
    if tp > 1:
        activation_bytes = knobs.micro_batch_size * knobs.seq_len * arch.hidden_size * 2.0
        tp_seconds = 4 * arch.num_layers * micro_batches * 2.0 * activation_bytes * (tp - 1) / tp / nvlink
    return fsdp, tp_seconds


def estimate_throughput(arch: ModelArchitecture, knobs: TrainingKnobs, instance: InstanceType, nodes: int) -> Estimate:
    """Predict step time, tokens/s per GPU, MFU and USD per billion tokens."""
    par = parallelism_for(knobs, instance.gpus_per_node, nodes)
    micro_batches = knobs.gradient_accumulation_steps
    tokens_per_group_step = knobs.micro_batch_size * knobs.seq_len * micro_batches  # one TP group
    compute = compute_seconds_per_token(arch, knobs, instance) * tokens_per_group_step
    fixed = LAYER_OVERHEAD_SECONDS[knobs.compile] * arch.num_layers * micro_batches
    fsdp, tp_seconds = communication_seconds_per_step(arch, knobs, instance, nodes)
    exposed = max(0.0, fsdp - FSDP_OVERLAP * compute) + tp_seconds
    step = compute + fixed + exposed
    tokens_per_second_per_gpu = tokens_per_group_step / knobs.tensor_parallel / step
    flops = model_flops_per_token(arch, knobs.seq_len) * tokens_per_second_per_gpu
    mfu = flops / (instance.gpu.peak_tflops("bf16") * 1e12)
    gpus = par.world_size
    usd_per_billion = instance.usd_per_hour.value * nodes / tokens_billion(tokens_per_second_per_gpu, gpus, 1.0)
    global_tokens = knobs.micro_batch_size * knobs.seq_len * micro_batches * par.data_parallel
    return Estimate(
        tokens_per_second_per_gpu=tokens_per_second_per_gpu,
        mfu=mfu,
        step_seconds=step,
        usd_per_billion_tokens=usd_per_billion,
        tflops_per_gpu=flops / 1e12,
        exposed_communication_seconds=exposed,
        global_batch_tokens=global_tokens,
    )


def gradient_accumulation_for(global_batch_tokens: int, micro_batch_size: int, seq_len: int, data_parallel: int) -> int:
    """Micro-batches per step that reach the target global batch (at least one)."""
    per_micro_step = micro_batch_size * seq_len * data_parallel
    return max(1, math.ceil(global_batch_tokens / per_micro_step - 1e-9))
