"""Apply the knobs to a :class:`~btk_trainer.model.Decoder`: precision, TP, AC, compile, FSDP2.

The order follows torchtitan: float8/MXFP8 module swap -> tensor parallel -> activation
checkpointing -> ``torch.compile`` per block -> FSDP2 ``fully_shard`` per block and root.

Device mesh: ``(dp_replicate, dp_shard, tp)``. ``full_shard`` shards over every data-parallel
rank (``dp_replicate = 1``); ``hybrid_shard`` shards within a node and replicates across
nodes (``dp_replicate = nodes``, HSDP through a 2-D mesh); ``no_shard`` replicates
everywhere (``dp_shard = 1``, plain data parallel through the same code path).
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812 (PyTorch's own spelling, as in torchtitan and transformers)
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

from btk.errors import BtkError
from btk.knobs import TrainingKnobs, knob_combination_problem
from btk.loss_chunks import loss_chunk_tokens
from btk.profile import ModelArchitecture
from btk_trainer.context_parallel import apply_context_parallel
from btk_trainer.cpu_float8 import use_native_float8_matmul_on_cpu
from btk_trainer.layout import MeshShape, mesh_shape
from btk_trainer.model import (
    ChunkedCrossEntropy,
    ChunkKernel,
    Decoder,
    chunked_linear_cross_entropy,
    cross_entropy_chunk,
)
from btk_trainer.third_party_logs import quiet_third_party_logs

__all__ = ["MeshShape", "build_mesh", "data_parallel_rank", "float8_all_gather_enabled", "mesh_shape", "parallelize",
           "train_context"]

# torchao is imported lazily below; its import-time lines that no user can act on are dropped first.
quiet_third_party_logs(cuda_available=torch.cuda.is_available())

MIN_FP8_CAPABILITY = (8, 9)  # Ada/Hopper and newer have fp8 tensor cores
MIN_MXFP8_CAPABILITY = (10, 0)  # Blackwell


def build_mesh(shape: MeshShape, device_type: str) -> DeviceMesh:
    """The job's mesh ``(dp_replicate, dp_shard, cp, tp)``; FSDP shards over ``dp_shard x cp``, flattened as
    ``dp_shard_cp`` (torchtitan's layout: the ranks sharing a sequence reduce its gradients)."""
    mesh = init_device_mesh(
        device_type, (shape.dp_replicate, shape.dp_shard, shape.cp, shape.tp),
        mesh_dim_names=("dp_replicate", "dp_shard", "cp", "tp"),
    )
    if shape.cp > 1:
        mesh["dp_shard", "cp"]._flatten(mesh_dim_name="dp_shard_cp")
    return mesh


def data_parallel_rank(mesh: DeviceMesh) -> tuple[int, int]:
    """(dp_rank, dp_size) of this process: ranks of one TP group share a data slice."""
    rep, shard = mesh["dp_replicate"], mesh["dp_shard"]
    return rep.get_local_rank() * shard.size() + shard.get_local_rank(), rep.size() * shard.size()


def check_precision(precision: str, capability: tuple[int, int] | None) -> None:
    """Fail clearly when the GPU (``None``: no GPU) cannot run ``precision``."""
    if precision == "bf16":
        return
    if capability is None:
        raise BtkError(f"precision={precision} needs an NVIDIA GPU with fp8 tensor cores; use precision=bf16 here")
    found = f"{capability[0]}.{capability[1]}"
    if precision == "mxfp8" and capability < MIN_MXFP8_CAPABILITY:
        raise BtkError(
            f"precision=mxfp8 needs a Blackwell GPU (compute capability >= 10.0), this GPU is {found}; "
            "use fp8_tensorwise or fp8_rowwise"
        )
    if capability < MIN_FP8_CAPABILITY:
        raise BtkError(f"precision={precision} needs compute capability >= 8.9 (Hopper/Blackwell), this GPU is {found}")


def float8_all_gather_enabled(precision: str, shape: MeshShape) -> bool:
    """Whether FSDP all-gathers float8 weights (tensorwise scaling and a sharded data-parallel dim).

    Then the trainer calls torchao's ``precompute_float8_dynamic_scale_for_fsdp`` after every
    optimizer step, as torchtitan does.
    """
    return precision == "fp8_tensorwise" and shape.dp_shard * shape.cp > 1


def _low_precision_filter(module: nn.Module, fqn: str, *, multiple: int = 16) -> bool:
    """Swap only the blocks' linears whose dims suit the kernels (fp8: multiples of 16, MXFP8's
    32-element scaling blocks: 32); never the head."""
    if not isinstance(module, nn.Linear) or "lm_head" in fqn:
        return False
    return module.in_features % multiple == 0 and module.out_features % multiple == 0


def apply_low_precision(model: Decoder, precision: str, *, fsdp_float8_all_gather: bool,
                        emulate_mxfp8: bool = False) -> int:
    """Swap linears for torchao float8 (tensorwise/rowwise) or MXFP8 training; returns how many.

    ``emulate_mxfp8``: MXFP8 in torchao's hardware-agnostic emulation (tests on CPU), not its
    Blackwell kernels.
    """
    if precision == "bf16":
        return 0
    multiple = 32 if precision == "mxfp8" else 16

    def swappable(module: nn.Module, fqn: str) -> bool:
        return _low_precision_filter(module, fqn, multiple=multiple)

    if precision in ("fp8_tensorwise", "fp8_rowwise"):
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        use_native_float8_matmul_on_cpu()  # without a GPU: torch's emulation, not oneDNN's reference kernel

        swapped = sum(1 for fqn, module in model.named_modules() if swappable(module, fqn))
        config = Float8LinearConfig.from_recipe_name(precision.removeprefix("fp8_"))
        if precision == "fp8_tensorwise" and fsdp_float8_all_gather:
            config = Float8LinearConfig(
                enable_fsdp_float8_all_gather=True,
                cast_config_input=config.cast_config_input,
                cast_config_weight=config.cast_config_weight,
                cast_config_grad_output=config.cast_config_grad_output,
            )
        if precision == "fp8_rowwise":
            # Rowwise scales are powers of two computed in fp32; unless Inductor emulates the
            # eager precision casts, the compiled cast can round differently and, with
            # activation checkpointing recomputing it, produce NaNs (as torchtitan sets it).
            import torch._inductor.config

            torch._inductor.config.emulate_precision_casts = True
        convert_to_float8_training(model, config=config, module_filter_fn=swappable)
        return swapped
    if precision == "mxfp8":
        return swap_mxfp8_linears(model, swappable, emulate=emulate_mxfp8)
    raise BtkError(f"unknown precision {precision!r}")


def swap_mxfp8_linears(model: Decoder, swappable: Any, *, emulate: bool) -> int:
    """Replace each swappable ``nn.Linear`` by torchao's ``MXFP8Linear`` (a module swap, as torchtitan does).

    ``MXFP8Linear`` is an ``nn.Linear`` whose forward quantises input and weight to MXFP8 and
    adds the bias after the scaled matmul, so biased linears (Qwen's q/k/v) keep their bias and
    its gradient, and its parameters stay plain tensors: checkpoints load under DCP's
    ``weights_only`` unpickler and export as ordinary weights. (torchao's weight-wrapper
    tensor, ``MXFP8TrainingOpConfig``, drops the bias and cannot be unpickled by DCP.)
    """
    from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    preference = KernelPreference.EMULATED if emulate else KernelPreference.AUTO
    targets = [(fqn, module) for fqn, module in model.named_modules() if swappable(module, fqn)]
    for fqn, module in targets:
        parent_name, _, child = fqn.rpartition(".")
        parent = model.get_submodule(parent_name)
        weight = module.weight
        replacement = MXFP8Linear(module.in_features, module.out_features, bias=module.bias is not None,
                                  device=weight.device, dtype=weight.dtype, kernel_preference=preference)
        if weight.device.type != "meta":
            with torch.no_grad():
                replacement.weight.copy_(weight)
                if module.bias is not None:
                    replacement.bias.copy_(module.bias)
        setattr(parent, child, replacement)
    return len(targets)


class LossParallelHead(ColwiseParallel):
    """``ColwiseParallel`` for :class:`~btk_trainer.model.OutputHead`, whose forward also takes the targets
    and the loss function and then returns the loss instead of logits.

    The stock style's hooks see only the first argument (its input hook would drop the targets)
    and would redistribute whatever comes out to ``output_layouts``. Here the hidden states are
    prepared as usual (sequence-sharded -> replicated: one all-gather) and the other arguments
    pass through; the loss (:class:`VocabParallelCrossEntropy`'s plain tensor, or a 0-d DTensor
    from a cross-entropy under ``loss_parallel()``) comes back as a plain tensor, logits as the
    vocabulary-sharded DTensor torchtitan's head returns.
    """

    def __init__(self) -> None:
        super().__init__(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)

    @staticmethod
    def _prepare_input_fn(input_layouts: Any, desired_input_layouts: Any, mod: nn.Module, inputs: Any,
                          device_mesh: DeviceMesh) -> Any:
        # torch leaves the styles' hook functions unannotated.
        hidden = ColwiseParallel._prepare_input_fn(  # type: ignore[no-untyped-call]  # torch leaves it unannotated
            input_layouts, desired_input_layouts, mod, inputs[:1], device_mesh)
        return (hidden, *inputs[1:])

    @staticmethod
    def _prepare_output_fn(output_layouts: Any, use_local_output: bool, mod: nn.Module, outputs: Any,
                           device_mesh: DeviceMesh) -> Any:
        if outputs.ndim == 0:  # the loss, already reduced over the vocabulary shards
            from torch.distributed.tensor import DTensor

            return outputs.full_tensor() if isinstance(outputs, DTensor) else outputs
        return ColwiseParallel._prepare_output_fn(  # type: ignore[no-untyped-call]  # torch leaves it unannotated
            output_layouts, use_local_output, mod, outputs, device_mesh)


def _vocab_shard_statistics(hidden: torch.Tensor, head_weight: torch.Tensor, local_targets: torch.Tensor,
                            inside: torch.Tensor, softcap: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's fp32 logits of a chunk (soft-capped when ``softcap`` is given) and, per token, its (max, sum of
    exp(logit - max), target logit or 0)."""
    logits = F.linear(hidden, head_weight).float()
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    maximum = logits.amax(-1, keepdim=True)
    sum_exp = (logits - maximum).exp().sum(-1, keepdim=True)
    picked = logits.gather(-1, local_targets[:, None]) * inside[:, None]
    return logits, torch.cat([maximum, sum_exp, picked], dim=-1)


def _vocab_shard_gradient(logits: torch.Tensor, log_normaliser: torch.Tensor, local_targets: torch.Tensor,
                          inside: torch.Tensor, scale: float, dtype: torch.dtype,
                          softcap: float | None = None) -> torch.Tensor:
    """``scale`` x (softmax - one_hot(target)) on this rank's vocabulary shard, in ``dtype``; w.r.t. the logits
    before the soft cap when ``logits`` are capped (times the cap's derivative ``1 - (logits / softcap)^2``)."""
    gradient = (logits - log_normaliser).exp()
    gradient = gradient.scatter_add(-1, local_targets[:, None], -inside[:, None].to(gradient.dtype))
    if softcap is not None:
        gradient = gradient * (1.0 - (logits / softcap).square())
    return (gradient * scale).to(dtype)


class _VocabParallelFunction(torch.autograd.Function):
    """:class:`~btk_trainer.model.ChunkedCrossEntropy`'s autograd function on the DTensors of the loss-parallel
    head: replicated hidden states, vocabulary-sharded weight. The hidden states' gradient comes back
    ``Partial`` (each rank's vocabulary shard contributes), which the head's input preparation reduce-scatters
    to the sequence shard, as the stock column-parallel head's backward does."""

    @staticmethod
    def forward(ctx: Any, hidden: Any, head_weight: Any, targets: torch.Tensor, kernel: ChunkKernel,
                chunk_tokens: int) -> torch.Tensor:
        local_hidden = hidden.to_local()
        rows = local_hidden.reshape(-1, local_hidden.shape[-1])
        loss, hidden_gradient, weight_gradient = chunked_linear_cross_entropy(
            rows, head_weight.to_local(), targets.reshape(-1), kernel, chunk_tokens,
            gradients=ctx.needs_input_grad[0] or ctx.needs_input_grad[1])
        ctx.hidden_layout = (hidden.device_mesh, local_hidden.shape, hidden.shape, hidden.stride())
        ctx.weight_layout = (head_weight.device_mesh, head_weight.placements, head_weight.shape, head_weight.stride())
        ctx.save_for_backward(hidden_gradient, weight_gradient)
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[Any, ...]:
        from torch.distributed.tensor import DTensor, Partial

        hidden_gradient, weight_gradient = ctx.saved_tensors
        mesh, local_shape, shape, stride = ctx.hidden_layout
        hidden_grad = DTensor.from_local(hidden_gradient.mul_(grad_loss).view(local_shape), mesh, [Partial()],
                                         run_check=False, shape=shape, stride=stride)
        mesh, placements, shape, stride = ctx.weight_layout
        weight_grad = DTensor.from_local(weight_gradient.mul_(grad_loss), mesh, placements, run_check=False,
                                         shape=shape, stride=stride)
        return hidden_grad, weight_grad, None, None, None


class VocabParallelCrossEntropy:
    """The chunked loss of the loss-parallel head (a :data:`~btk_trainer.model.LossFn` on DTensors).

    Each rank computes its vocabulary shard's logits chunk by chunk; the softmax's normaliser is
    merged across the shards from each shard's (max, sum of exponentials) with the target's logit
    in one all-gather per chunk (``loss_parallel()`` takes three all-reduces for the same), so
    no rank holds more than one chunk of its shard's logits (the chunk size is
    :func:`btk.loss_chunks.loss_chunk_tokens` of the shard's vocabulary). ``compile_backend``
    compiles the two local pieces around the all-gather (the fused loss).
    """

    def __init__(self, compile_backend: str | None = None, softcap: float | None = None) -> None:
        self.softcap = softcap  # the final logits' soft cap (Gemma 2)
        self.statistics: Any = _vocab_shard_statistics
        self.gradient: Any = _vocab_shard_gradient
        if compile_backend is not None:
            self.statistics = torch.compile(_vocab_shard_statistics, fullgraph=True, backend=compile_backend)
            self.gradient = torch.compile(_vocab_shard_gradient, fullgraph=True, backend=compile_backend)

    def __call__(self, hidden: torch.Tensor, head_weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        if not isinstance(head_weight, DTensor) or head_weight.placements != (Shard(0),):
            raise BtkError("the vocabulary-parallel loss needs the head weight sharded over the vocabulary")
        mesh = head_weight.device_mesh
        shard_vocab = head_weight.to_local().shape[0]
        kernel = self._kernel(mesh.get_group(), mesh.size(), mesh.get_local_rank() * shard_vocab, shard_vocab)
        chunk = loss_chunk_tokens(targets.numel(), shard_vocab, head_weight.shape[1])
        loss: torch.Tensor = _VocabParallelFunction.apply(  # type: ignore[no-untyped-call]  # torch's apply is unannotated
            hidden, head_weight, targets, kernel, chunk)
        return loss

    def _kernel(self, group: Any, ranks: int, vocab_start: int, shard_vocab: int) -> ChunkKernel:
        def kernel(hidden: torch.Tensor, head_weight: torch.Tensor, targets: torch.Tensor,
                   scale: float) -> tuple[torch.Tensor, torch.Tensor]:
            local_targets = targets - vocab_start
            inside = (local_targets >= 0) & (local_targets < shard_vocab)
            local_targets = local_targets.clamp(0, shard_vocab - 1)
            logits, mine = self.statistics(hidden, head_weight, local_targets, inside, self.softcap)
            gathered = torch.empty((ranks * mine.shape[0], mine.shape[1]), dtype=mine.dtype, device=mine.device)
            dist.all_gather_single(gathered, mine, group=group)
            every = gathered.view(ranks, *mine.shape)
            maximum = every[..., 0:1].amax(0)
            log_normaliser = maximum + (every[..., 1:2] * (every[..., 0:1] - maximum).exp()).sum(0).log()
            loss = (log_normaliser - every[..., 2:3].sum(0)).sum()
            return loss, self.gradient(logits, log_normaliser, local_targets, inside, scale, hidden.dtype,
                                       self.softcap)

        return kernel


class SequenceShardedEmbedding(RowwiseParallel):
    """Vocabulary-parallel embedding whose output is reduce-scattered to this rank's sequence shard (torchtitan's
    ``RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))``), returned as a copy.

    ``to_local()`` returns a view; the first compiled block takes that view as its input and
    AOT autograd regenerates it from its base, which drops the gradient to the embedding
    (zero on CPU with ``aot_eager``). The copy is one micro-batch of sequence-sharded hidden
    states.
    """

    def __init__(self) -> None:
        super().__init__(input_layouts=Replicate(), output_layouts=Shard(1))

    @staticmethod
    def _prepare_output_fn(output_layouts: Any, use_local_output: bool, mod: nn.Module, outputs: Any,
                           device_mesh: DeviceMesh) -> Any:
        local = RowwiseParallel._prepare_output_fn(  # type: ignore[no-untyped-call]  # torch leaves it unannotated
            output_layouts, use_local_output, mod, outputs, device_mesh)
        return local.clone()


def _check_tensor_parallel_divides(arch: ModelArchitecture, seq_len: int, tp: int) -> None:
    for name, count in (("num_kv_heads", arch.num_kv_heads), ("num_attention_heads", arch.num_attention_heads),
                        ("ffn_hidden_size", arch.ffn_hidden_size), ("vocab_size", arch.vocab_size),
                        ("seq_len", seq_len)):
        if count % tp:
            raise BtkError(f"tensor_parallel={tp} must divide {name} ({count}); lower tensor_parallel")


def apply_tensor_parallel(model: Decoder, tp_mesh: DeviceMesh, precision: str, seq_len: int) -> None:
    """Megatron-style TP with sequence parallelism and a loss-parallel head, as torchtitan's Llama plan.

    Inside each block q/k/v/gate/up are column-parallel and o/down row-parallel; between the
    blocks the residual stream is sharded along the sequence (``Shard(1)``): the norms run on
    their sequence shard (``SequenceParallel``), attention and MLP all-gather their input
    (``PrepareModuleInput``) and the row-parallel outputs reduce-scatter back to it, so the
    all-reduce of plain TP becomes an all-gather + reduce-scatter of the same bytes and no
    rank repeats the norm work or keeps the full residual activations. The embedding is
    vocabulary-parallel (its output reduce-scattered to the sequence shard), the head
    column-parallel with its logits left vocabulary-sharded, its loss the chunked
    :class:`VocabParallelCrossEntropy`: no rank materialises the full logits. A tied
    head shares the embedding's (vocabulary-sharded) weight again after both are split.
    fp8_tensorwise uses torchao's float8 styles, whose input preparation (on CUDA) casts to
    float8 before the all-gather.
    """
    from torch.distributed.tensor.parallel import PrepareModuleInput, parallelize_module

    tp = tp_mesh.size()
    _check_tensor_parallel_divides(model.arch, seq_len, tp)
    colwise: Any = ColwiseParallel
    rowwise: Any = RowwiseParallel
    prepare_input: Any = PrepareModuleInput
    if precision == "fp8_tensorwise":
        from torchao.float8.float8_tensor_parallel import (
            Float8ColwiseParallel,
            Float8RowwiseParallel,
            PrepareFloat8ModuleInput,
        )

        colwise, rowwise, prepare_input = Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput
        if dist.get_backend(tp_mesh.get_group()) == "gloo":
            # Sequence parallelism moves float8 tensors through collectives (the inputs gathered
            # in float8, the row-parallel outputs' float8 gradients in backward), which gloo
            # cannot carry: on gloo (CPU tests), float8 TP keeps plain TP's all-reduces. NCCL and
            # the dry run's fake process group (btk_trainer.dryrun) take the GPU's path.
            _apply_plain_tensor_parallel(model, tp_mesh, colwise, rowwise)
            return
    elif problem := knob_combination_problem(precision, tp):
        raise BtkError(problem)
    tied = model.weights_tied
    parallelize_module(model, tp_mesh, {
        "model.embed_tokens": SequenceShardedEmbedding(),
        "model.norm": SequenceParallel(),
        "lm_head": LossParallelHead(),
    })
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.loss_fn = VocabParallelCrossEntropy(softcap=model.arch.final_logit_softcapping)
    plan = {
        "self_attn": prepare_input(input_layouts=(Shard(1), None, None, None),  # x, cos, sin, mask
                                   desired_input_layouts=(Replicate(), None, None, None)),
        "self_attn.q_proj": colwise(),
        "self_attn.k_proj": colwise(),
        "self_attn.v_proj": colwise(),
        "self_attn.o_proj": rowwise(output_layouts=Shard(1)),
        "mlp": prepare_input(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "mlp.gate_proj": colwise(),
        "mlp.up_proj": colwise(),
        "mlp.down_proj": rowwise(output_layouts=Shard(1)),
        **_block_norm_plan(model.arch),
        **_qk_norm_plan(model.arch),
    }
    for layer in model.model.layers:
        parallelize_module(layer, tp_mesh, plan)


def _block_norm_plan(arch: ModelArchitecture) -> dict[str, Any]:
    """The residual-stream norms run on their sequence shard.

    Pre-norm blocks hand their norms' output to attention and the MLP, whose input preparation
    takes the sequence-sharded DTensor; OLMo 2's post-norms hand theirs to the residual add,
    which holds plain tensors, so they return the local shard. Gemma's sandwich has both kinds.
    """
    if arch.norm_placement == "pre":
        return {"input_layernorm": SequenceParallel(), "post_attention_layernorm": SequenceParallel()}
    if arch.norm_placement == "sandwich":
        return {"input_layernorm": SequenceParallel(), "pre_feedforward_layernorm": SequenceParallel(),
                "post_attention_layernorm": SequenceParallel(use_local_output=True),
                "post_feedforward_layernorm": SequenceParallel(use_local_output=True)}
    return {"post_attention_layernorm": SequenceParallel(use_local_output=True),
            "post_feedforward_layernorm": SequenceParallel(use_local_output=True)}


def _qk_norm_plan(arch: ModelArchitecture) -> dict[str, Any]:
    """q_norm/k_norm on this rank's heads, their weights replicated (torchtitan's Qwen3 plan).

    The column-parallel q/k projections leave each rank its heads: dimension 2 of the
    ``(batch, seq, heads, head_dim)`` q for per-head norms, of the ``(batch, seq, heads·head_dim)``
    projection for OLMo 2's. As a DTensor sharded there, a per-head norm stays local and its weight
    gradient is summed over the ranks' heads; a whole-projection norm's mean over the last
    dimension becomes a reduction across the ranks, so each element is normalised over all heads
    as in one process, and its weight is used (and its gradient gathered) slice by slice.
    """
    if arch.qk_norm == "none":
        return {}
    return {name: SequenceParallel(sequence_dim=2, use_local_output=True)
            for name in ("self_attn.q_norm", "self_attn.k_norm")}


def _apply_plain_tensor_parallel(model: Decoder, tp_mesh: DeviceMesh, colwise: Any, rowwise: Any) -> None:
    """Megatron TP inside the blocks only: replicated norms, embedding and head, one all-reduce per row-parallel
    output (QK-norms on the ranks' heads, as :func:`_qk_norm_plan`)."""
    from torch.distributed.tensor.parallel import parallelize_module

    plan = {name: colwise() for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                         "mlp.gate_proj", "mlp.up_proj")}
    plan.update({"self_attn.o_proj": rowwise(), "mlp.down_proj": rowwise(), **_qk_norm_plan(model.arch)})
    for layer in model.model.layers:
        parallelize_module(layer, tp_mesh, plan)


def train_context(shape: MeshShape) -> AbstractContextManager[Any]:
    """What forward and backward run under: ``loss_parallel()`` with tensor parallelism (a cross-entropy taken
    of the head's vocabulary-sharded logits; torch requires the backward inside it too), else nothing."""
    if shape.tp == 1:
        return nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


def async_tensor_parallel_applies(requested: bool, *, compiled: bool, device_type: str, tp: int) -> bool:
    """Whether a job runs async TP: only when it asks for it (``JobSettings.async_tensor_parallel``, off by
    default, as torchtitan's ``enable_async_tensor_parallel``), and only where torch offers it: compiled
    blocks on CUDA with a tensor-parallel degree above 1."""
    return requested and compiled and device_type == "cuda" and tp > 1


def enable_async_tensor_parallel(tp_mesh: DeviceMesh, *, compiled: bool, requested: bool = False) -> bool:
    """Async TP where the job asks for it and torch offers it (:func:`async_tensor_parallel_applies`).

    Inductor's micro-pipeline pass splits each all-gather -> matmul and matmul -> reduce-scatter
    of the sequence-parallel blocks into chunks that overlap, through symmetric memory on the
    TP group. It exists only in compiled graphs and only for NCCL on CUDA; elsewhere, or when the
    job does not ask for it, nothing is set (returns whether it was enabled).
    """
    if not async_tensor_parallel_applies(requested, compiled=compiled, device_type=tp_mesh.device_type,
                                         tp=tp_mesh.size()):
        return False
    import torch._inductor.config
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group

    torch._inductor.config._micro_pipeline_tp = True
    enable_symm_mem_for_group(tp_mesh.get_group().group_name)
    return True


# The block's linears: bf16 ones dispatch to mm/addmm, torchao float8 ones to _scaled_mm. All
# count alike, so fp8 + selective saves the same 4 of 7 outputs as bf16 (what btk.planner.memory models).
_MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten._scaled_mm.default}

# torchtitan's save list, by name where an op exists only in some builds (its ``_get_default_save_ops``, formerly
# ``_save_list``: https://github.com/pytorch/torchtitan/blob/b5bcd76c66d0acb1a08b176d9639425bc55e0b2a/torchtitan/
# distributed/activation_checkpoint.py), beside the partitioner's compute-intensive ops it starts from.
_SAVED_BY_NAME = (
    "aten._scaled_dot_product_cudnn_attention", "aten._scaled_dot_product_attention_math",
    "aten._scaled_dot_product_fused_attention_overrideable",
    # Low precision: the absolute maximum each float8 scale is computed from (torchao's amax is aten.max).
    "aten.max", "aten.linear",
    "aten.topk",  # torchtitan: MoE routing, kept for the same list
    "_c10d_functional.reduce_scatter_tensor", "_c10d_functional.all_to_all_single",
    # Not in torchtitan's list: torch's CPU flash attention, so the CPU tests save attention as the GPU kernels are.
    "aten._scaled_dot_product_flash_attention_for_cpu",
)


def _sac_save_list() -> set[Any]:
    """Ops whose outputs selective AC saves (unless :func:`selective_policy` recomputes every other matmul):
    torchtitan's list, i.e. the min-cut partitioner's compute-intensive ops (matmuls, SDPA kernels), the other
    attention kernels, ``aten.max`` (float8 scales), flex attention and compiled regions, the TP reduce-scatter."""
    from torch._functorch.partitioners import get_default_op_list

    packets: list[Any] = list(get_default_op_list().compute_intensive_ops)  # OpOverloadPackets, typed as callables
    ops: set[Any] = {packet.default for packet in packets}
    for name in _SAVED_BY_NAME:
        namespace, _, op = name.partition(".")
        packet = getattr(getattr(torch.ops, namespace), op, None)
        if packet is not None:
            ops.add(packet.default)
    for higher_order in ("flex_attention", "inductor_compiled_code"):
        if (found := getattr(torch._higher_order_ops, higher_order, None)) is not None:
            ops.add(found)
    return ops


def selective_policy() -> Any:
    """Per-op SAC policy (torchtitan's ``SelectiveAC``): save what :func:`_sac_save_list` names, but recompute every
    other matmul (bf16 and float8 alike, see ``_MATMULS``)."""
    from torch.utils.checkpoint import CheckpointPolicy

    save = _sac_save_list()
    counts: dict[str, int] = defaultdict(int)

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        mode = "recompute" if ctx.is_recompute else "forward"
        if func in _MATMULS:
            counts[mode] += 1
            if counts[mode] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _sac_context() -> Any:
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    # torch leaves this function unannotated; its return value is the context_fn pair checkpoint expects.
    return create_selective_checkpoint_contexts(selective_policy())  # type: ignore[no-untyped-call]  # torch leaves it unannotated


def _keep_seeded_policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
    """Recompute every op but the random-seeded ones (in a block: attention, whose kernels take a dropout)."""
    from torch.utils.checkpoint import CheckpointPolicy

    seeded = torch.Tag.nondeterministic_seeded in getattr(func, "tags", ())
    return CheckpointPolicy.MUST_SAVE if seeded else CheckpointPolicy.PREFER_RECOMPUTE


def _keep_seeded_context() -> Any:
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_keep_seeded_policy)  # type: ignore[no-untyped-call]  # torch leaves it unannotated


def keeps_attention_under_full_checkpointing(device_type: str, *, compiled: bool, tp: int) -> bool:
    """Whether ``full`` AC must save attention: compiled tensor-parallel blocks off CUDA.

    Recomputing a random-seeded op in a compiled block makes AOT autograd save the RNG state
    for backward. On CUDA it threads the generator state through the graph's inputs; elsewhere
    (CPU) it appends the state to the saved values after the opaque objects, and under tensor
    parallelism the saved values hold the block's ``DeviceMesh``: torch then misreads the mesh
    as a saved tensor and fails. Saving the attention instead (the only seeded op in a block)
    keeps everything else recomputed. The trainer compiles only on CUDA; this is the CPU
    (``aot_eager``) test path.
    """
    return compiled and tp > 1 and device_type != "cuda"


def apply_activation_checkpointing(model: Decoder, mode: str, *, keep_attention: bool = False) -> None:
    """Wrap each block: ``full`` recomputes the block (``keep_attention``: all but attention, see
    :func:`keeps_attention_under_full_checkpointing`), ``selective`` follows :func:`selective_policy`."""
    if mode == "none":
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for index, layer in enumerate(model.model.layers):
        if mode == "full" and keep_attention:
            wrapped = checkpoint_wrapper(layer, preserve_rng_state=False, context_fn=_keep_seeded_context)
        elif mode == "full":
            wrapped = checkpoint_wrapper(layer, preserve_rng_state=False)
        elif mode == "selective":
            wrapped = checkpoint_wrapper(layer, preserve_rng_state=False, context_fn=_sac_context)
        else:
            raise BtkError(f"unknown activation_checkpointing {mode!r}")
        model.model.layers[index] = wrapped


def apply_compile(model: Decoder, backend: str = "inductor") -> None:
    """``torch.compile`` each block in place (parameter names are unchanged).

    ``fullgraph=True``: a graph break in a block is an error at the first step, not a silent
    slowdown. Tests pass ``backend="aot_eager"`` to trace the same graphs on CPU without Inductor.
    """
    for layer in model.model.layers:
        layer.compile(fullgraph=True, backend=backend)


def apply_fused_loss(model: Decoder, backend: str = "inductor") -> None:
    """Compile the chunked loss's kernel: per chunk, head matmul + upcast + log-sum-exp + softmax gradient in one
    graph, no fp32 copy of the chunk's logits (the vocabulary-parallel loss: its two local pieces)."""
    softcap = model.arch.final_logit_softcapping
    if isinstance(model.loss_fn, VocabParallelCrossEntropy):
        model.loss_fn = VocabParallelCrossEntropy(compile_backend=backend, softcap=softcap)
    else:
        model.loss_fn = ChunkedCrossEntropy(torch.compile(cross_entropy_chunk, fullgraph=True, backend=backend),
                                            softcap=softcap)


def apply_fsdp(model: Decoder, mesh: DeviceMesh, shape: MeshShape, param_dtype: torch.dtype | None) -> None:
    """FSDP2 ``fully_shard`` groups, as torchtitan: the embeddings, each block, final norm + head, the root.

    The embeddings are a group of their own (gathered for the first op only, their gradient
    reduce-scattered while the rest of backward runs); the final norm and the head form one
    group kept gathered between forward and backward (``reshard_after_forward=False``: backward
    starts with them). Left in the root, both would be all-gathered before the first block and
    reduce-scattered after the last gradient, each exposed. Every block, the last one too, is
    resharded after forward (torchtitan's ``apply_fsdp_to_decoder``): FSDP's backward prefetch
    all-gathers the last block when the head's backward starts, so keeping it gathered saved
    one all-gather and held a block's bf16 weights through the loss's peak. Tied embeddings share
    one weight with the head, so they stay in the root group. fp32 gradient reduction.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if shape.cp == 1:
        dp_mesh = mesh["dp_shard"] if shape.dp_replicate == 1 else mesh["dp_replicate", "dp_shard"]
    elif shape.dp_replicate == 1:  # the flattened dim, taken from its parts (build_mesh made it)
        dp_mesh = mesh["dp_shard", "cp"]._flatten(mesh_dim_name="dp_shard_cp")
    else:  # HSDP needs the 2-D (replicate, shard) mesh: sliced from the root, flattened dim included
        with warnings.catch_warnings():
            # torch 2.13 says slicing a flattened dim from the root mesh "will be deprecated" and offers no other
            # way to build this 2-D mesh (torchtitan slices it alike): nothing a user of the trainer can change.
            warnings.filterwarnings("ignore", message="Slicing a flattened dim from root mesh", category=UserWarning)
            dp_mesh = mesh["dp_replicate", "dp_shard_cp"]
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    if not model.weights_tied:
        fully_shard(model.model.embed_tokens, mesh=dp_mesh, mp_policy=policy)
    for layer in model.model.layers:
        fully_shard(layer, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=True)
    if not model.weights_tied:
        fully_shard([model.model.norm, model.lm_head], mesh=dp_mesh, mp_policy=policy, reshard_after_forward=False)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy)


def parallelize(
    model: Decoder,
    knobs: TrainingKnobs,
    mesh: DeviceMesh,
    shape: MeshShape,
    *,
    param_dtype: torch.dtype | None,
    capability: tuple[int, int] | None,
    compile_enabled: bool | None = None,
    fused_loss_enabled: bool | None = None,
    compile_backend: str = "inductor",
    emulate_mxfp8: bool = False,
    async_tensor_parallel: bool = False,
) -> Decoder:
    """Apply every knob to ``model`` (in place) and return it.

    ``compile_enabled`` / ``fused_loss_enabled`` override ``knobs.compile`` / ``knobs.fused_loss``
    (the trainer turns both off on CPU, where Inductor would need a C++ toolchain and minutes);
    ``compile_backend`` is the ``torch.compile`` backend of both; ``emulate_mxfp8`` runs MXFP8
    in torchao's emulation (CPU tests); ``async_tensor_parallel``: the job asks for async TP
    (:func:`enable_async_tensor_parallel`).
    """
    check_precision(knobs.precision, capability)
    apply_low_precision(model, knobs.precision,
                        fsdp_float8_all_gather=float8_all_gather_enabled(knobs.precision, shape),
                        emulate_mxfp8=emulate_mxfp8)
    compiled = knobs.compile if compile_enabled is None else compile_enabled
    if shape.tp > 1:
        apply_tensor_parallel(model, mesh["tp"], knobs.precision, knobs.seq_len // shape.cp)
        enable_async_tensor_parallel(mesh["tp"], compiled=compiled and compile_backend == "inductor",
                                     requested=async_tensor_parallel)
    if shape.cp > 1:
        apply_context_parallel(model, mesh["cp"])
    apply_activation_checkpointing(model, knobs.activation_checkpointing, keep_attention=(
        keeps_attention_under_full_checkpointing(mesh.device_type, compiled=compiled, tp=shape.tp)))
    if compiled:
        apply_compile(model, compile_backend)
    if knobs.fused_loss if fused_loss_enabled is None else fused_loss_enabled:
        apply_fused_loss(model, compile_backend)
    apply_fsdp(model, mesh, shape, param_dtype)
    return model

