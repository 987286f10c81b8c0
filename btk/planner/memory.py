"""Per-GPU peak memory of one training step (FSDP2 / HSDP / DDP, optional TP).

The model sums, at the step's peak phase:

* **parameters, gradients, optimizer** — mixed-precision AdamW keeps fp32 master weights
  (4 B/param), fp32 gradients (4 B/param, FSDP2 ``reduce_dtype=float32``) and two fp32 moments
  (8 B/param): the 16 bytes/parameter of ZeRO (Rajbhandari et al. 2020, §3.1), divided by the
  sharding degree and the tensor-parallel degree.
* **activations** — what autograd saves per token per layer, by checkpointing mode, in the
  style of Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
  Models", §4.1, eq. 1) adapted to a Llama block with SDPA/flash attention (no ``a·s²``
  score term), GQA and SwiGLU, term by term as the trainer's block saves them
  (:func:`saved_activation_bytes_per_token_per_layer`). ``h`` is the residual width, ``a =
  heads·head_dim`` the width of q and of attention's output (``h`` for most models, not all:
  Qwen3-4B 4096 against 2560, Mistral NeMo 4096 against 5120), ``kv`` the width of k and v
  (they enter attention with their own heads, SDPA ``enable_gqa``: no copy repeated to the
  query heads), ``f`` the FFN width; bf16 = 2 bytes per element.

  - ``none``: the two matmul inputs of the residual stream (the norms' outputs, or with norms
    after the sublayers the sublayers' inputs), q and k after RoPE, v, attention's output (soft-capped
    or windowed alike: ``flex_attention`` keeps what SDPA keeps) and
    its fp32 log-sum-exp per head, the FFN's gate, up and their product (and eagerly
    silu(gate)); eagerly each RMSNorm keeps its fp32 upcast and its bf16 cast (fp32 normalised
    input where it scales in fp32, as OLMo 2's do), compiled only the input and its fp32
    inverse RMS (Inductor's partitioner recomputes the rest), for each of the block's two norms (Gemma's
    four, whose mid-block residual Inductor recomputes from the block input and attention's normalised
    output). QK-norm keeps the same for q and k.
  - ``selective`` (torchtitan's per-op policy: save SDPA and every other matmul output —
    q, v, gate, down — recompute the rest): block input + those outputs + SDPA's, plus one
    layer's recompute working set in backward;
  - ``full``: only each block's input, plus one layer's full working set.

  Tensor parallelism runs with sequence parallelism (as torchtitan): what lies between the
  blocks' matmuls (residual stream, norms) is sharded along the sequence, the heads and the
  FFN by TP; but a column-parallel linear saves its all-gathered input (the full sequence),
  and a row-parallel one under selective checkpointing saves its output's full-sequence
  partial sums before the reduce-scatter (and the policy saves the reduce-scatter's output).
  Every term was read from autograd's saved tensors of the trainer's block, eager and with
  tensor parallelism through the dry run, compiled by Inductor on the CPU
  (``tests/trainer/test_activation_memory.py``).
* **logits** — the trainer's chunked cross-entropy (:mod:`btk.loss_chunks`): one chunk's logits
  at their peak (fused/compiled: bf16 logits and their gradient, 4 B/vocab entry/token; eager:
  + fp32 copy, softmax and a log-sum-exp temporary, 14 B), the head weight's gradient (fp32
  accumulator + bf16 result) and the hidden states' bf16 gradient. Vocabulary terms divided by TP:
  the head is column-parallel with cross-entropy under ``loss_parallel()``, so each rank
  holds only its vocabulary shard of the logits.
* **other** — FSDP parameters gathered in flight (output head + one block in bf16 at the loss;
  two blocks + one block's fp32 gradient in backward), as Megatron-LM's
  ``theoretical_memory_usage.py`` accounts for buffers outside the weights.

Two phases can be the peak: the loss (all activations + logits) and the first backward
recompute (all activations + one layer's working set). The breakdown reports the larger.
Calibration against torchtitan measurements: ``docs/calibration.md``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from btk.knobs import TrainingKnobs
from btk.loss_chunks import loss_peak_bytes, whole_loss_peak_bytes
from btk.profile import ModelArchitecture

GIB = 1024**3
BF16 = 2
FP32 = 4
ADAM_STATE_BYTES = 8


@dataclass(frozen=True)
class Parallelism:
    """How a job's GPUs are used: world size, tensor- and context-parallel degrees, sharding degree (FSDP's shard
    group: the data-parallel ranks and, under context parallelism, the ranks sharing each sequence)."""

    world_size: int
    gpus_per_node: int
    tensor_parallel: int
    shard_degree: int
    context_parallel: int = 1

    @property
    def data_parallel(self) -> int:
        """Ranks that read different sequences."""
        return self.world_size // (self.tensor_parallel * self.context_parallel)

    @property
    def fsdp_ranks(self) -> int:
        """Ranks over which FSDP shards and reduces (data-parallel x context-parallel): shard groups x replicas."""
        return self.world_size // self.tensor_parallel


def parallelism_for(knobs: TrainingKnobs, gpus_per_node: int, nodes: int) -> Parallelism:
    """Derive the sharding degree from the knobs and the cluster shape."""
    world = gpus_per_node * nodes
    tp, cp = knobs.tensor_parallel, knobs.context_parallel
    fsdp = world // tp  # the trainer shards over dp_shard x cp
    if knobs.sharding == "full_shard":
        shard = fsdp
    elif knobs.sharding == "hybrid_shard":
        shard = max(1, min(fsdp, gpus_per_node // tp))
    else:
        shard = 1
    return Parallelism(world_size=world, gpus_per_node=gpus_per_node, tensor_parallel=tp, shard_degree=shard,
                       context_parallel=cp)


@dataclass(frozen=True)
class MemoryBreakdown:
    """Per-GPU peak memory in GiB, by category (the ``memory_gib`` JSON object)."""

    parameters: float
    gradients: float
    optimizer: float
    activations: float
    logits: float
    other: float
    total: float
    capacity: float
    peak_phase: str

    @property
    def headroom(self) -> float:
        return self.capacity - self.total

    def as_json(self) -> dict[str, float]:
        data = asdict(self)
        data.pop("peak_phase")
        return {key: round(value, 2) for key, value in data.items()}

    def largest_part(self) -> str:
        parts = {
            "parameters": self.parameters,
            "gradients": self.gradients,
            "optimizer": self.optimizer,
            "activations": self.activations,
            "logits": self.logits,
            "other": self.other,
        }
        return max(parts, key=lambda key: parts[key])


INVERSE_RMS = FP32
"""An RMSNorm keeps one fp32 inverse root-mean-square per normalised row for its backward."""


def _eager_norm_bytes(width: int, scale_in_fp32: bool) -> int:
    """Bytes an eager RMSNorm of ``width`` keeps per row beside its output and inverse RMS: the fp32 upcast of
    its input, and the normalised input its weight multiplies (bf16 after the cast, or fp32 scaling in fp32)."""
    return (FP32 + (FP32 if scale_in_fp32 else BF16)) * width


def saved_activation_bytes_per_token_per_layer(arch: ModelArchitecture, knobs: TrainingKnobs) -> float:
    """Bytes autograd keeps per token per layer between forward and backward (rank-local under TP)."""
    h, a, kv, f = arch.hidden_size, arch.attention_width, arch.kv_dim, arch.ffn_hidden_size
    t = knobs.tensor_parallel
    log_sum_exp = FP32 * arch.num_attention_heads  # SDPA's, per query head
    if knobs.activation_checkpointing == "full":
        return h * BF16 / t  # the block input (sequence-sharded under TP)
    if knobs.activation_checkpointing == "selective":
        needed = (h + 2 * a + kv + f) * BF16 + log_sum_exp  # block input, q, SDPA's output and log-sum-exp, v, gate
        if knobs.compile:  # Inductor drops the saved outputs backward never reads
            return needed / t
        # Eagerly the policy also keeps the down projection's output (under TP the full sequence's partial sums
        # before their reduce-scatter) and, under TP, both reduce-scatters' outputs (sequence-sharded).
        return (needed + (2 * h * BF16 if t > 1 else 0)) / t + h * BF16
    # No checkpointing. Under TP the column-parallel linears save their all-gathered input (full sequence).
    matmul_inputs = 2 * h * BF16
    attention = (2 * a + 2 * kv) * BF16 + log_sum_exp  # q and k after RoPE, v, attention's output
    fp32_scale = arch.norms_scale_in_fp32
    count = arch.norms_per_block  # two, or Gemma's four
    if knobs.compile:  # Inductor keeps each norm's input and recomputes the rest
        # but for Gemma's mid-block residual (the MLP's norm's input): the block input plus attention's normalised
        # output, both at hand, make it again.
        norms = (count - 1 if arch.is_gemma else count) * h * BF16
        ffn = 3 * f * BF16  # gate, up, their product
        qk_norm = (a + kv) * BF16
    else:
        norms = _eager_norm_bytes(h, fp32_scale) * count
        ffn = 4 * f * BF16  # gate, up, silu(gate) or gelu(gate), their product
        qk_norm = _eager_norm_bytes(a, fp32_scale) + _eager_norm_bytes(kv, fp32_scale)
    norms += count * INVERSE_RMS
    if arch.qk_norm == "none":
        qk_norm = 0
    elif arch.qk_norm == "head":  # an inverse RMS per head, the heads sharded by TP
        qk_norm += INVERSE_RMS * (arch.num_attention_heads + arch.num_kv_heads)
    else:  # over the whole projection: one per token for q and for k, on every TP rank
        return (norms + attention + ffn + qk_norm) / t + matmul_inputs + 2 * INVERSE_RMS
    return (norms + attention + ffn + qk_norm) / t + matmul_inputs


def gathered_key_value_bytes_per_layer(arch: ModelArchitecture, knobs: TrainingKnobs) -> float:
    """Bytes of the other ranks' keys and values one attention layer gathers under context parallelism (0 without):
    ``(cp - 1) / cp`` of the micro-batch's sequences, K and V in bf16, the KV heads split by TP. Attention's backward
    reads them: saved without checkpointing, gathered again in the recompute with it."""
    cp = knobs.context_parallel
    others = knobs.micro_batch_size * knobs.seq_len * (cp - 1) / cp
    return others * 2 * arch.kv_dim * BF16 / knobs.tensor_parallel


def layer_working_set_bytes_per_token(arch: ModelArchitecture, knobs: TrainingKnobs) -> float:
    """One layer's activations re-created during its recompute + backward."""
    if knobs.activation_checkpointing == "none":
        return 0.0
    full = knobs.model_copy(update={"activation_checkpointing": "none"})
    return saved_activation_bytes_per_token_per_layer(arch, full)


def logits_peak_bytes(arch: ModelArchitecture, knobs: TrainingKnobs, tokens: int, *, whole_logits: bool) -> float:
    """Peak bytes of the loss of ``tokens`` tokens (vocabulary-sharded by TP: loss-parallel head): the trainer's
    chunked loss, or (``whole_logits``) one holding the logits whole, as the published runs did."""
    tp = knobs.tensor_parallel
    if whole_logits:
        return whole_loss_peak_bytes(tokens, arch.vocab_size, tensor_parallel=tp, fused=knobs.fused_loss)
    return loss_peak_bytes(tokens, arch.vocab_size, arch.hidden_size, tensor_parallel=tp, fused=knobs.fused_loss)


def estimate_memory(
    arch: ModelArchitecture, knobs: TrainingKnobs, gpus_per_node: int, nodes: int, capacity_gib: float,
    *, whole_logits: bool = False,
) -> MemoryBreakdown:
    """Per-GPU peak memory for one training step with these knobs (``whole_logits``: a published run whose loss
    held the micro-batch's logits whole, not the trainer's chunked loss)."""
    par = parallelism_for(knobs, gpus_per_node, nodes)
    tp = par.tensor_parallel
    n_local = arch.parameter_count / tp / par.shard_degree
    parameters = FP32 * n_local
    gradients = FP32 * n_local
    optimizer = ADAM_STATE_BYTES * n_local

    tokens = knobs.tokens_per_micro_batch()  # this rank's share of the micro-batch under context parallelism
    gathered = gathered_key_value_bytes_per_layer(arch, knobs)
    saved = saved_activation_bytes_per_token_per_layer(arch, knobs) * tokens * arch.num_layers
    working_set = layer_working_set_bytes_per_token(arch, knobs) * tokens
    if knobs.activation_checkpointing == "none":
        saved += gathered * arch.num_layers
    else:  # checkpointing saves no gather's output (selective keeps attention's, not its inputs): recomputed
        working_set += gathered
    logits = logits_peak_bytes(arch, knobs, tokens, whole_logits=whole_logits)

    block_bf16 = arch.parameters_per_layer * BF16 / tp
    head_bf16 = arch.vocab_size * arch.hidden_size * BF16 / tp
    sharded = par.shard_degree > 1
    in_flight_loss = (head_bf16 + block_bf16) if sharded else 0.0
    in_flight_backward = (2 * block_bf16 + arch.parameters_per_layer * FP32 / tp) if sharded else 0.0

    loss_phase = saved + logits + in_flight_loss
    backward_phase = saved + working_set + in_flight_backward
    if loss_phase >= backward_phase:
        activations, logits_part, other, phase = saved, logits, in_flight_loss, "loss"
    else:
        activations, logits_part, other, phase = saved + working_set, 0.0, in_flight_backward, "backward"

    static = parameters + gradients + optimizer
    total = static + activations + logits_part + other
    return MemoryBreakdown(
        parameters=parameters / GIB,
        gradients=gradients / GIB,
        optimizer=optimizer / GIB,
        activations=activations / GIB,
        logits=logits_part / GIB,
        other=other / GIB,
        total=total / GIB,
        capacity=capacity_gib,
        peak_phase=phase,
    )
