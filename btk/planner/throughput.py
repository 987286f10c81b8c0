"""Step time, tokens/s per GPU, MFU and cost of one training configuration.

Model (per GPU, per optimizer step):

* **FLOPs.** Matmul FLOPs per token are ``6·N`` (forward 2N, backward 4N; Kaplan et al. 2020)
  with N the matmul parameters (blocks + output head, not the embedding lookup). Causal
  attention executes ``6·L·a·s`` FLOPs per token with flash attention (half of the
  ``12·L·a·s`` that the MFU convention below counts), ``a`` the attention width
  heads × head_dim (the hidden size for most models, not for Qwen3-4B or Mistral NeMo).
  Recompute adds the forward FLOPs that the checkpointing mode re-runs: ``selective`` re-runs
  wk, wo and w3; ``full`` re-runs the whole block forward including attention.
* **Compute time.** Linear-layer FLOPs run at the precision's dense peak (fp8/mxfp8 peaks
  for the block linears; the output head stays bf16, as torchao/torchtitan convert it).
  Achieved throughput is ``peak × achieved_matmul_fraction × S/(S + S₀)``: the GPU's
  calibrated fraction (``btk.hardware``) scaled down for GEMMs too small to fill the GPU.
  ``S`` is a GEMM's output size per TP rank, micro-batch tokens × hidden size / TP, so both a
  short micro-batch and a narrow model (or a high TP degree) lower it; ``S₀`` is fitted
  (``ThroughputConstants.gemm_half_efficiency``). One constant for both because a GEMM's
  wave count depends on its output tiles, rows times columns. A float8 GEMM's ``S₀`` is its
  peak's multiple of bf16's: its fixed part (wave tails, the epilogue's HBM writes) does not
  speed up with the tensor cores.
* **Attention** (flash attention's ``QKᵀ`` and ``PV``, forward, backward and recompute) is not
  a GEMM of the linear layers' shape: it runs at its own fraction of the bf16 peak,
  ``achieved_matmul_fraction × attention_efficiency`` (both ``btk.hardware``, per GPU family),
  fitted on the sequence sweeps of the calibration set (2k to 64k tokens, A100 and H100),
  where attention goes from a few per cent of a step's FLOPs to most of them.
* **Non-matmul work** (norms, RoPE, SwiGLU, residual adds, the loss) is bound by HBM
  bandwidth, not by tensor cores. Its bytes are counted per token
  (:func:`elementwise_bytes_per_token`): per layer and pass, ``10·h + 2·a + 2·kv + 3·f``
  bf16 elements read or written (two norms, two residual adds, RoPE on q and k, SwiGLU),
  nothing more for a QK-norm (OLMo 2, Qwen3): compiled, it can fuse with RoPE, which reads and
  writes the same queries and keys (docs/calibration.md: the published OLMo 2 runs do not tell
  the two counts apart); three passes (forward, and a backward that reads and writes about
  twice as much) plus one for recompute, and the loss's logits (8 bytes per
  vocabulary entry fused, 30 for an eager fp32 cross-entropy). They scale with the model's
  *width* (``h``, ``f``), while matmul FLOPs scale with its square, so a wide model spends a
  smaller share of its step here.
  Time is those bytes at the GPU's HBM bandwidth times ``non_matmul_overhead`` (fitted per
  GPU family: kernels reach a fraction of peak bandwidth, and launch gaps add to them): an
  H200 (4.8 TB/s) trains faster than an H100 with the same tensor cores, and a 500 W HBM2e
  H100 (2.4 TB/s) slower. It does not shrink with float8.
* **Float8 casts.** Dynamic scaling reads bf16 (twice: amax, then cast) and writes fp8 for
  the input and the output gradient of every converted linear, in both layouts:
  ``12·(in+out)`` bytes per token per linear at 70 % of HBM bandwidth, times a fitted
  factor per scaling recipe (``ThroughputConstants.cast_cost``): compiled, the amax and the
  cast fuse into the kernels beside them, and tensorwise moves about half those bytes. The
  cost depends on the GEMM's shape: casts grow with ``in+out`` per token while the GEMM's
  FLOPs grow with ``in·out``, so narrow models gain less from float8; the tensorwise factor
  is pinned by float8 ablations from 2,048 to 8,192 wide (docs/calibration.md).
* **Eager mode.** Without ``torch.compile`` the element-wise work (norms, RoPE, SwiGLU,
  residual adds) runs as separate kernels: the non-matmul overhead is multiplied by a
  fitted factor (``ThroughputConstants.eager_overhead_factor``), fitted to torchtitan's
  eager and compiled runs of the same configuration.
* **Fixed per-micro-batch cost.** Kernel launches and FSDP hooks: 40 µs per layer compiled,
  120 µs eager, per micro-batch.
* **Communication.** FSDP all-gathers each layer's bf16 parameters (float8 block weights under
  tensorwise scaling, as the trainer does) before its forward and again before its backward,
  and reduce-scatters its fp32 gradients after every micro-batch's backward; HSDP shards inside
  a node and all-reduces the gradient shard across nodes, one GPU per node in each group; DDP
  all-reduces whole gradients (:func:`layer_communication`). Inside a node NVLink carries a
  collective (80 % of link rate); across nodes a ring through every GPU of a node shares the
  node's EFA bandwidth at the share nccl-tests measured on P5 for that many nodes, plus a
  latency per collective that grows with the node count (``btk.hardware.CollectiveTiming``).
  Transfers overlap compute layer by layer, bounded by the compute they hide behind: only
  what exceeds a layer's forward or backward waits, plus the first all-gather and the last
  reduction; overlapped transfers still cost a fitted share of their time
  (``communication_interference``) and every collective across nodes its latency
  (:func:`communication_seconds_per_step`). Tensor parallelism stays inside a node and runs
  with sequence parallelism, as the trainer and torchtitan do
  (:func:`tensor_parallel_seconds_per_step`): per layer and micro-batch, 4 all-gathers and 4
  reduce-scatters of the sequence-sharded activation, the input all-gathers re-run by
  recompute, float8 gathers under tensorwise scaling, and one HBM copy of the full
  activation per collective (the sequence is not NCCL's gather dimension). The
  vocabulary-parallel embedding and the loss-parallel head add one collective each per
  micro-batch (2 beside 10 per layer: under 1 % of the TP traffic of a 32-layer model), left
  out. The per-rank compute divides by TP, the output head's included: its logits and
  cross-entropy are vocabulary-sharded (no rank computes the full head), and the norms run on
  a sequence shard. TP traffic does not overlap. Context parallelism gives each rank
  ``seq_len / cp`` of every sequence (load-balanced: the causal attention's work per token is the
  whole sequence's average) and per layer one all-gather of the keys and values (again in any
  recompute) and one reduce-scatter of their gradients, over NVLink and exposed
  (:func:`context_parallel_seconds_per_step`).

**MFU** uses torchtitan's convention (``6·N + 12·L·a·s`` FLOPs per token against the dense
bf16 peak; torchtitan writes ``12·l·h·q·t`` with h heads of width q) so figures compare with
published ones. Calibration: ``docs/calibration.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from btk.hardware import InstanceType
from btk.knobs import TrainingKnobs
from btk.planner.cost import tokens_billion
from btk.planner.memory import gathered_key_value_bytes_per_layer, parallelism_for
from btk.profile import ModelArchitecture

MFU_PEAK = "dense bf16"
"""The peak every MFU figure is a share of, whatever the plan's precision (torchtitan's convention)."""

ELEMENTWISE_PASSES = 3.0
"""Forward, and a backward that reads and writes about twice the forward's element-wise bytes."""
LOSS_BYTES_PER_VOCAB = {True: 8.0, False: 30.0}
"""Per token and vocabulary entry. Fused: bf16 logits written and read, their gradient written and
read. Eager fp32 cross-entropy: also the fp32 copy, log-softmax and fp32 gradient, read and written."""
CAST_BANDWIDTH_FRACTION = 0.70
CAST_BYTES_PER_FEATURE = 12.0


@dataclass(frozen=True)
class ThroughputConstants:
    """The model's GPU-independent fitted constants (``benchmarks/calibrate.py`` fits them).

    Attributes:
        eager_overhead_factor: non-matmul time without ``torch.compile`` relative to compiled;
            fitted to the eager and compiled twins of torchtitan's runs (8 and 128 H100s, and 32 on p5).
        gemm_half_efficiency: GEMM output size ``S₀`` (tokens × hidden / TP) at which a
            GEMM reaches half the GPU's calibrated fraction; fitted across micro-batches
            1, 2 and 12 and tensor parallelism 1 and 8.
        cast_cost: each precision's dynamic-scaling casts as a multiple of ``12·(in+out)``
            bytes per token and linear. Tensorwise is below 1 because, compiled, the amax and
            the cast fuse into the kernels beside them; fitted to the tensorwise ablations of
            models 2,048 to 8,192 wide. Rowwise computes a scale per row and casts a second,
            column-wise copy for the backward pass (and on Hopper runs slower rowwise-scaled
            GEMMs, which this factor absorbs); MXFP8 writes one e8m0 scale per 32 values in
            both layouts. Fitted to the rowwise and MXFP8 runs of the calibration set.
        communication_interference: the share of overlapped data-parallel communication time
            that still slows the step (NCCL kernels take SMs and HBM bandwidth from the compute
            they overlap); fitted to the multi-node runs against their single-node twins.
    """

    eager_overhead_factor: float = 1.0
    gemm_half_efficiency: float = 0.0
    communication_interference: float = 0.0
    cast_cost: dict[str, float] = field(default_factory=lambda: {"bf16": 0.0, "fp8_tensorwise": 1.0})

    def cast_factor(self, precision: str) -> float:
        return self.cast_cost[precision]


FITTED_CONSTANTS = ThroughputConstants(
    eager_overhead_factor=2.076,
    gemm_half_efficiency=7.038e+06,
    communication_interference=0.08373,
    cast_cost={"bf16": 0.0, "fp8_tensorwise": 0.5593, "fp8_rowwise": 2.323, "mxfp8": 0.9315},
)
"""``benchmarks/calibrate.py``'s fit to the calibration set (``docs/calibration.md``)."""
LINK_EFFICIENCY = 0.80
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
    """FLOPs per token by torchtitan's MFU convention: ``6·N + 12·L·a·s`` (a = heads × head_dim; ``L·s`` is
    :meth:`~btk.profile.ModelArchitecture.attention_span`, less where Gemma's blocks attend within a window)."""
    return 6.0 * arch.matmul_parameters + 12.0 * arch.attention_width * arch.attention_span(seq_len)


def _linear_shapes(arch: ModelArchitecture) -> list[tuple[int, int]]:
    """(in, out) of a block's linears: wq, wk, wv, wo, w1, w3, w2."""
    h, a, kv, f = arch.hidden_size, arch.attention_width, arch.kv_dim, arch.ffn_hidden_size
    return [(h, a), (h, kv), (h, kv), (a, h), (h, f), (h, f), (f, h)]


def recompute_flops_per_token(arch: ModelArchitecture, knobs: TrainingKnobs) -> tuple[float, float]:
    """Extra (linear, attention) forward FLOPs per token re-run by activation checkpointing."""
    h, a, kv, f, layers = arch.hidden_size, arch.attention_width, arch.kv_dim, arch.ffn_hidden_size, arch.num_layers
    if knobs.activation_checkpointing == "selective":
        return 2.0 * layers * (h * kv + a * h + h * f), 0.0  # wk, wo, w3
    if knobs.activation_checkpointing == "full":
        linear_block = sum(i * o for i, o in _linear_shapes(arch))
        return 2.0 * layers * linear_block, 2.0 * a * arch.attention_span(knobs.seq_len)
    return 0.0, 0.0


def gemm_shape_factor(
    arch: ModelArchitecture, knobs: TrainingKnobs, constants: ThroughputConstants, speedup: float = 1.0
) -> float:
    """Fraction of the calibrated matmul rate that GEMMs of this width and row count reach.

    ``speedup`` is the GEMM's peak relative to bf16: a GEMM's fixed part (wave tails, the
    epilogue's HBM writes of its output) does not get faster with the tensor cores, so a
    float8 GEMM needs ``speedup`` times the output size to reach the same fraction.
    """
    size = knobs.tokens_per_micro_batch() * arch.hidden_size / knobs.tensor_parallel
    return size / (size + constants.gemm_half_efficiency * speedup)


def attention_flops_per_token(arch: ModelArchitecture, knobs: TrainingKnobs) -> float:
    """Causal attention FLOPs per token executed by flash attention, forward, backward and recompute."""
    _, recompute = recompute_flops_per_token(arch, knobs)
    return 6.0 * arch.attention_width * arch.attention_span(knobs.seq_len) + recompute


def block_elementwise_bytes_per_token(arch: ModelArchitecture, knobs: TrainingKnobs) -> float:
    """HBM bytes of one compiled block's non-matmul work per token: forward, backward and any recompute."""
    h, a, kv, f = arch.hidden_size, arch.attention_width, arch.kv_dim, arch.ffn_hidden_size
    norms = 2 * h * (arch.norms_per_block - 2)  # Gemma's two more norms, each reading and writing the stream
    per_pass = 2.0 * (10 * h + norms + 2 * a + 2 * kv + 3 * f)  # bf16 elements read or written per layer
    passes = ELEMENTWISE_PASSES + (0.0 if knobs.activation_checkpointing == "none" else 1.0)
    return per_pass * passes


def elementwise_bytes_per_token(arch: ModelArchitecture, knobs: TrainingKnobs) -> float:
    """HBM bytes of the non-matmul work per token (whole model, one TP rank's share before dividing by TP)."""
    return (arch.num_layers * block_elementwise_bytes_per_token(arch, knobs)
            + LOSS_BYTES_PER_VOCAB[knobs.fused_loss] * arch.vocab_size)


def compute_seconds_per_token(
    arch: ModelArchitecture,
    knobs: TrainingKnobs,
    instance: InstanceType,
    constants: ThroughputConstants = FITTED_CONSTANTS,
) -> float:
    """Seconds of GPU work per token for one TP rank (linears, attention, non-matmul work, fp8 casts)."""
    gpu = instance.gpu
    speedup = gpu.peak_tflops(knobs.precision) / gpu.peak_tflops("bf16")
    fraction = gpu.achieved_matmul_fraction.value
    bf16_peak = gpu.peak_tflops("bf16") * 1e12
    bf16_rate = bf16_peak * fraction * gemm_shape_factor(arch, knobs, constants)
    linear_shape = gemm_shape_factor(arch, knobs, constants, speedup)
    linear_rate = gpu.peak_tflops(knobs.precision) * 1e12 * fraction * linear_shape
    attention_rate = bf16_peak * fraction * gpu.attention_efficiency.value
    block_linear_params = arch.num_layers * sum(i * o for i, o in _linear_shapes(arch))
    head_params = arch.vocab_size * arch.hidden_size
    recompute_linear, _ = recompute_flops_per_token(arch, knobs)
    seconds = (
        (6.0 * block_linear_params + recompute_linear) / linear_rate
        + 6.0 * head_params / bf16_rate
        + attention_flops_per_token(arch, knobs) / attention_rate
    )
    hbm = gpu.hbm_bandwidth_tbps.value * 1e12
    overhead = gpu.non_matmul_overhead.value * (1.0 if knobs.compile else constants.eager_overhead_factor)
    seconds += overhead * elementwise_bytes_per_token(arch, knobs) / hbm
    if knobs.precision != "bf16":
        cast_bytes = CAST_BYTES_PER_FEATURE * arch.num_layers * sum(i + o for i, o in _linear_shapes(arch))
        cast_bytes *= constants.cast_factor(knobs.precision)
        seconds += cast_bytes / (hbm * CAST_BANDWIDTH_FRACTION)
    return seconds / knobs.tensor_parallel


def float8_all_gather(knobs: TrainingKnobs, shard_degree: int) -> bool:
    """Whether FSDP gathers float8 weights: the trainer's rule (tensorwise scaling, sharded)."""
    return knobs.precision == "fp8_tensorwise" and shard_degree > 1


@dataclass(frozen=True)
class Collective:
    """One collective's group: how many ranks, how many of them share a node, and what it costs per byte."""

    ranks: int
    ranks_per_node: int

    @property
    def nodes(self) -> int:
        return max(1, self.ranks // self.ranks_per_node)

    def transfer_seconds(self, instance: InstanceType, bus_bytes: float) -> float:
        """Time to move ``bus_bytes`` per rank (nccl-tests' bus bytes: (n-1)/n of the buffer, twice for all-reduce).

        Inside one NVLink domain (one node, or the instances of one UltraServer) the ranks' NVLink
        carries it; across domains, rings through every GPU of a node share the node's network (each
        group gets the share of its ranks on the node) at the fabric's measured bandwidth share for
        that many nodes (:class:`btk.hardware.CollectiveTiming`).
        """
        if self.ranks <= 1:
            return 0.0
        if self.over_nvlink(instance):
            return bus_bytes / (instance.gpu.nvlink_gbps_per_direction.value * 1e9 * LINK_EFFICIENCY)
        share = instance.collectives.bandwidth_share(self.nodes)
        node_bytes_per_second = instance.efa_gbps_per_node.value / 8 * 1e9 * share
        return bus_bytes / (node_bytes_per_second * self.ranks_per_node / instance.gpus_per_node)

    def over_nvlink(self, instance: InstanceType) -> bool:
        """Whether the group's nodes lie in one NVLink domain (a job is placed on as few UltraServers as fit)."""
        return self.nodes <= instance.nvlink_domain_nodes

    def latency_seconds(self, instance: InstanceType) -> float:
        """The fabric's fixed time per collective across nodes (0 over NVLink: its latency is microseconds)."""
        return instance.collectives.latency(self.nodes) if self.ranks > 1 and not self.over_nvlink(instance) else 0.0


@dataclass(frozen=True)
class LayerCommunication:
    """FSDP/HSDP/DDP seconds per layer and micro-batch: transfers forward and backward wait for, the tail, latency."""

    forward: float
    """Parameter all-gather of the next layer, overlapping this layer's forward."""
    backward: float
    """All-gather again (resharded after forward), gradient reduce-scatter and the replicas' all-reduce."""
    tail: float
    """The last reduction of a backward pass: no compute is left to hide it."""
    latency: float
    """The fabric's fixed time of the layer's collectives (forward and backward) across nodes."""
    gather_latency: float
    """The part of ``latency`` that is the two parameter all-gathers."""


def data_parallel_collectives(
    knobs: TrainingKnobs, instance: InstanceType, nodes: int
) -> tuple[Collective, Collective]:
    """(shard group, replica group) of one rank, with how many of their ranks share a node."""
    par = parallelism_for(knobs, instance.gpus_per_node, nodes)
    per_node = max(1, instance.gpus_per_node // par.tensor_parallel)  # data-parallel ranks of one TP rank per node
    shard = Collective(par.shard_degree, min(par.shard_degree, per_node))
    replicas = par.fsdp_ranks // par.shard_degree
    # a replica group takes one rank from each shard group: within a node when the shard group is
    # smaller than the node's ranks (no_shard), else one rank per node
    replica = Collective(replicas, max(1, min(replicas, per_node // shard.ranks_per_node)))
    return shard, replica


def layer_communication(
    arch: ModelArchitecture, knobs: TrainingKnobs, instance: InstanceType, nodes: int
) -> LayerCommunication:
    """Data-parallel communication per layer and micro-batch (the whole model's parameters split evenly by layer).

    FSDP2, as the trainer runs it, all-gathers a layer's bf16 parameters (float8 block weights
    under tensorwise scaling) before its forward and again before its backward, and
    reduce-scatters its fp32 gradients after every micro-batch's backward (gradient sync is
    not skipped while accumulating); HSDP then all-reduces the gradient shard across the
    replicas, and DDP all-reduces whole gradients.
    """
    shard, replica = data_parallel_collectives(knobs, instance, nodes)
    tp = knobs.tensor_parallel
    layer_params = arch.parameter_count / arch.num_layers / tp
    layer_linear = sum(i * o for i, o in _linear_shapes(arch)) / tp
    gathered = 2.0 * layer_params - (layer_linear if float8_all_gather(knobs, shard.ranks) else 0.0)
    ring = (shard.ranks - 1) / shard.ranks
    all_gather = shard.transfer_seconds(instance, gathered * ring)
    reduce_scatter = shard.transfer_seconds(instance, 4.0 * layer_params * ring)
    replicas = replica.ranks
    all_reduce = replica.transfer_seconds(instance, 2.0 * 4.0 * layer_params / shard.ranks * (replicas - 1) / replicas)
    return LayerCommunication(
        forward=all_gather,
        backward=all_gather + reduce_scatter + all_reduce,
        tail=reduce_scatter + all_reduce,
        latency=3 * shard.latency_seconds(instance) + replica.latency_seconds(instance),
        gather_latency=2 * shard.latency_seconds(instance),
    )


def communication_seconds_per_step(
    arch: ModelArchitecture,
    knobs: TrainingKnobs,
    instance: InstanceType,
    nodes: int,
    compute_per_micro_batch: float,
    constants: ThroughputConstants = FITTED_CONSTANTS,
    reduce_every_micro_batch: bool = True,
) -> tuple[float, float]:
    """(data-parallel seconds the step waits for, non-overlapped TP seconds) per optimizer step.

    Transfers overlap compute, bounded by the compute they hide behind, layer by layer: a
    layer's forward all-gather runs during the previous layer's forward, its backward
    collectives during the next layer's backward; only what exceeds that compute waits, plus
    the first all-gather and the last reduction. Overlapped transfers are not free either:
    NCCL's kernels take SMs and HBM bandwidth from the compute they run beside, which costs
    ``ThroughputConstants.communication_interference`` of their time. A collective across
    nodes also synchronises every rank of its group: its fixed latency
    (:meth:`btk.hardware.CollectiveTiming.latency`, growing with the node count) is waited for.

    ``reduce_every_micro_batch``: the trainer's FSDP2 reduces gradients after every
    micro-batch; Megatron-Core (a calibration engine) only after the last one of a step.
    """
    comm = layer_communication(arch, knobs, instance, nodes)
    layers = arch.num_layers
    forward_share = forward_flops_share(arch, knobs)
    forward_layer = compute_per_micro_batch * forward_share / layers
    backward_layer = compute_per_micro_batch * (1 - forward_share) / layers

    def micro_batch(backward: float, tail: float, latency: float) -> float:
        exposed = (
            comm.forward
            + (layers - 1) * max(0.0, comm.forward - forward_layer)
            + (layers - 1) * max(0.0, backward - backward_layer)
            + tail
        )
        overlapped = max(0.0, layers * (comm.forward + backward) - exposed)
        return exposed + constants.communication_interference * overlapped + layers * latency

    reducing = micro_batch(comm.backward, comm.tail, comm.latency)
    steps = knobs.gradient_accumulation_steps
    if reduce_every_micro_batch:
        data_parallel = steps * reducing
    else:
        gathering = micro_batch(comm.backward - comm.tail, 0.0, comm.gather_latency)
        data_parallel = (steps - 1) * gathering + reducing
    return data_parallel, tensor_parallel_seconds_per_step(arch, knobs, instance)


def forward_flops_share(arch: ModelArchitecture, knobs: TrainingKnobs) -> float:
    """The forward pass's share of a micro-batch's FLOPs (recompute runs in the backward pass)."""
    linear = sum(i * o for i, o in _linear_shapes(arch)) * arch.num_layers + arch.vocab_size * arch.hidden_size
    attention = arch.attention_width * arch.attention_span(knobs.seq_len)
    recompute_linear, recompute_attention = recompute_flops_per_token(arch, knobs)
    forward = 2.0 * (linear + attention)
    return forward / (3.0 * forward + recompute_linear + recompute_attention)


def sequence_parallel_collectives(knobs: TrainingKnobs) -> tuple[int, int]:
    """(all-gathers, reduce-scatters) of the sequence-sharded activation per layer per micro-batch.

    Forward: attention and MLP each all-gather their input and reduce-scatter their output
    (2 + 2); backward runs the transposes (2 + 2). Recompute re-runs forward collectives:
    the per-op selective policy saves reduce-scatter outputs (torchtitan's and the trainer's
    save list) but not all-gathers, so the two input all-gathers run again; full
    checkpointing re-runs all four.
    """
    recomputed = {"none": (0, 0), "selective": (2, 0), "full": (2, 2)}[knobs.activation_checkpointing]
    return 4 + recomputed[0], 4 + recomputed[1]


def tensor_parallel_seconds_per_step(arch: ModelArchitecture, knobs: TrainingKnobs, instance: InstanceType) -> float:
    """Non-overlapped seconds of sequence-parallel TP per optimizer step (0 without TP).

    Each collective moves ``(tp-1)/tp`` of the full micro-batch activation over NVLink (ring).
    Float8 tensorwise gathers in float8: torchao's styles cast a block's input before its
    all-gather and the row-parallel outputs' gradients before theirs (1 byte); reduce-scatters
    stay bf16. Each collective also costs one HBM read and write of the full activation: the
    sequence is dimension 1 of ``(batch, seq, hidden)`` while NCCL gathers and scatters along
    dimension 0, so DTensor concatenates the gathered chunks and makes the scattered input
    contiguous (copies at the element-wise rate, ``CAST_BANDWIDTH_FRACTION``). Vanilla TP, as
    the calibration runs: the trainer's async TP (compiled) overlaps part of this, which the
    model does not credit.
    """
    tp = knobs.tensor_parallel
    if tp == 1:
        return 0.0
    gpu = instance.gpu
    nvlink = gpu.nvlink_gbps_per_direction.value * 1e9 * LINK_EFFICIENCY
    hbm = gpu.hbm_bandwidth_tbps.value * 1e12 * CAST_BANDWIDTH_FRACTION
    elements = knobs.micro_batch_size * knobs.seq_len * arch.hidden_size
    gather_bytes = elements * (1.0 if knobs.precision == "fp8_tensorwise" else 2.0)
    scatter_bytes = elements * 2.0
    gathers, scatters = sequence_parallel_collectives(knobs)
    per_layer = sum(
        count * size * ((tp - 1) / tp / nvlink + 2.0 / hbm)
        for count, size in ((gathers, gather_bytes), (scatters, scatter_bytes))
    )
    return per_layer * arch.num_layers * knobs.gradient_accumulation_steps


def context_parallel_gathers(knobs: TrainingKnobs) -> int:
    """All-gathers of each layer's keys and values per micro-batch: the forward's, and the recompute's under any
    checkpointing (no policy saves a gather's output)."""
    return 1 if knobs.activation_checkpointing == "none" else 2


def context_parallel_seconds_per_step(arch: ModelArchitecture, knobs: TrainingKnobs, instance: InstanceType) -> float:
    """Seconds per optimizer step that context parallelism's collectives add (0 without it), none of it hidden.

    Each attention layer all-gathers the keys and values of the ranks sharing the sequence
    (:func:`btk.planner.memory.gathered_key_value_bytes_per_layer`: ``(cp-1)/cp`` of the micro-batch's K and V)
    before it can attend, and its backward reduce-scatters their gradients (bf16) back: NVLink inside the node
    (the trainer keeps a sequence's ranks on one node). Counted as exposed: the gather sits between a layer's
    projections and its attention, and the reduce-scatter before the projections' backward, with no independent
    work beside them in the trainer's code.
    """
    if knobs.context_parallel == 1:
        return 0.0
    nvlink = instance.gpu.nvlink_gbps_per_direction.value * 1e9 * LINK_EFFICIENCY
    per_layer = gathered_key_value_bytes_per_layer(arch, knobs) * (context_parallel_gathers(knobs) + 1) / nvlink
    return per_layer * arch.num_layers * knobs.gradient_accumulation_steps


def estimate_throughput(
    arch: ModelArchitecture,
    knobs: TrainingKnobs,
    instance: InstanceType,
    nodes: int,
    constants: ThroughputConstants = FITTED_CONSTANTS,
    reduce_every_micro_batch: bool = True,
) -> Estimate:
    """Predict step time, tokens/s per GPU, MFU and USD per billion tokens (``reduce_every_micro_batch``:
    see :func:`communication_seconds_per_step`)."""
    par = parallelism_for(knobs, instance.gpus_per_node, nodes)
    micro_batches = knobs.gradient_accumulation_steps
    tokens_per_group_step = knobs.tokens_per_micro_batch() * micro_batches  # one TP group
    compute = compute_seconds_per_token(arch, knobs, instance, constants) * tokens_per_group_step
    fixed = LAYER_OVERHEAD_SECONDS[knobs.compile] * arch.num_layers * micro_batches
    data_parallel, tp_seconds = communication_seconds_per_step(
        arch, knobs, instance, nodes, compute / micro_batches, constants, reduce_every_micro_batch
    )
    exposed = data_parallel + tp_seconds + context_parallel_seconds_per_step(arch, knobs, instance)
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
