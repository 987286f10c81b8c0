"""The planner's activation memory, term by term, against what autograd saves in the trainer's block.

``btk.planner.memory.saved_activation_bytes_per_token_per_layer`` is the per-token, per-block
figure behind every plan's activation memory. Here it is compared with what the trainer's own
code keeps for backward, read two ways that share nothing with the planner:

* **eager, any parallelism** — the dry run (``btk_trainer.dryrun``: the trainer's
  ``build_model`` and ``parallelize``, the real checkpoint policies, a fake process group)
  measures the activations at the step's peak; differencing two depths (2 and 3 blocks) and
  two sequence lengths leaves exactly one block's bytes per token, free of the model-level
  terms (embedding, final norm, loss) and of per-block terms that do not grow with the tokens
  (float8 weight casts);
* **compiled** — one block through Inductor's ``compile_fx`` up to its code generation: its
  decompositions, its joint-graph passes and the min-cut partitioner that decides what a compiled
  block keeps, on a GPU as here (:func:`partitioned_as_inductor`), its saved tensors counted through
  ``saved_tensors_hooks`` (distinct storages, parameters and the RoPE tables left out) at one
  sequence length: all of it is per token, none of it a constant.

Layouts: Llama (GQA), Qwen3 (per-head QK-norm, head_dim wider than hidden / heads), OLMo 2
(norms after the sublayers, scaled in fp32, QK-norm over the whole projection) and Gemma 2/3 (four norms
scaling by 1 + w in fp32, GeGLU, windowed blocks; soft-capped attention as the dry run and a GPU keep it),
at widths where every term differs (h 256, a 256 or 384, kv 128 to 256, f 704).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from btk_trainer import dryrun
from btk_trainer.model import DecoderLayer, additive_mask, dense_positioned_mask, rope_tables
from trainer_fixtures import tiny_gemma2, tiny_gemma3, tiny_granite, tiny_llama, tiny_olmo2, tiny_qwen3, tiny_smollm3

from btk.hardware import get_instance_type
from btk.knobs import TrainingKnobs
from btk.planner.memory import saved_activation_bytes_per_token_per_layer
from btk.profile import ModelArchitecture, TrainingIntent

B200 = get_instance_type("ml.p6-b200.48xlarge")
MICRO_BATCH = 2
SEQ_LENGTHS = (512, 1024)
WIDTHS: dict[str, Any] = {"hidden_size": 256, "num_attention_heads": 4, "num_kv_heads": 2, "ffn_hidden_size": 704,
                          "vocab_size": 512, "max_context": 2048}
LAYOUTS: dict[str, Callable[..., ModelArchitecture]] = {
    "llama": lambda **depth: tiny_llama(**WIDTHS, **depth),
    "qwen3": lambda **depth: tiny_qwen3(**{**WIDTHS, "head_dim": 96}, **depth),
    "olmo2": lambda **depth: tiny_olmo2(**{**WIDTHS, "num_kv_heads": 4}, **depth),
    "granite": lambda **depth: tiny_granite(**WIDTHS, **depth),
    # Every third block without RoPE: the block a depth of 3 adds over 2 is one.
    "smollm3": lambda **depth: tiny_smollm3(**{**WIDTHS, "no_rope_interval": 3}, **depth),
    # Block 0 windowed, block 1 full; the block a depth of 3 adds over 2 is windowed.
    "gemma2": lambda **depth: tiny_gemma2(**WIDTHS, **depth),
    "gemma3": lambda **depth: tiny_gemma3(**{**WIDTHS, "head_dim": 96}, **depth),
}


def knobs(seq_len: int, **values: Any) -> TrainingKnobs:
    return TrainingKnobs.model_validate({"micro_batch_size": MICRO_BATCH, "seq_len": seq_len,
                                         "gradient_accumulation_steps": 1, **values})


def dry_run_activations(arch: ModelArchitecture, seq_len: int, **values: Any) -> tuple[float, str]:
    """The activations at the dry run's peak, in bytes, and the phase of the step the peak was in."""
    case = dryrun.DryRunCase(name="toy", architecture=arch, instance=B200, nodes=1, knobs=knobs(seq_len, **values),
                             training=TrainingIntent(seq_len=seq_len, global_batch_tokens=MICRO_BATCH * seq_len * 8))
    measured = dryrun.run_steps(case)
    return measured.activations * dryrun.GIB, measured.phase


def measured_block_bytes_per_token(layout: str, **values: Any) -> float:
    """One block's saved bytes per token: the dry run's activations differenced over depth, and over sequence
    length where a block also holds bytes that do not grow with the tokens (float8: its weights' casts).

    Without such bytes one sequence length is enough and stricter: a constant the planner does not count would
    show as a difference. Valid only when the peaks fall in the same phase of the step (then they hold the same
    model-level terms)."""
    make = LAYOUTS[layout]
    lengths = SEQ_LENGTHS if values.get("precision", "bf16") != "bf16" else SEQ_LENGTHS[:1]
    runs = {(depth, seq): dry_run_activations(make(num_layers=depth), seq, **values)
            for depth in (2, 3) for seq in lengths}
    assert len({phase for _, phase in runs.values()}) == 1, f"the peaks fall in different phases: {runs}"
    added_block = [runs[3, seq][0] - runs[2, seq][0] for seq in lengths]
    if len(lengths) == 1:
        return added_block[0] / (MICRO_BATCH * lengths[0])
    return (added_block[1] - added_block[0]) / (MICRO_BATCH * (lengths[1] - lengths[0]))


EAGER_CASES = [
    ("llama", {"activation_checkpointing": "none"}),
    ("llama", {"activation_checkpointing": "selective"}),
    ("llama", {"activation_checkpointing": "full"}),
    ("llama", {"activation_checkpointing": "none", "tensor_parallel": 2}),
    ("llama", {"activation_checkpointing": "selective", "tensor_parallel": 2, "precision": "fp8_tensorwise"}),
    ("llama", {"activation_checkpointing": "full", "tensor_parallel": 2}),
    ("qwen3", {"activation_checkpointing": "none"}),
    ("qwen3", {"activation_checkpointing": "none", "tensor_parallel": 2}),
    ("qwen3", {"activation_checkpointing": "selective", "tensor_parallel": 2}),
    ("olmo2", {"activation_checkpointing": "none"}),
    ("olmo2", {"activation_checkpointing": "none", "tensor_parallel": 2}),
    ("olmo2", {"activation_checkpointing": "selective"}),
    ("granite", {"activation_checkpointing": "none"}),
    ("granite", {"activation_checkpointing": "selective", "tensor_parallel": 2}),
    ("smollm3", {"activation_checkpointing": "none"}),
    ("gemma2", {"activation_checkpointing": "none"}),
    ("gemma2", {"activation_checkpointing": "selective"}),
    ("gemma2", {"activation_checkpointing": "none", "tensor_parallel": 2}),
    ("gemma3", {"activation_checkpointing": "none"}),
]


@pytest.mark.slow
@pytest.mark.parametrize(("layout", "values"), EAGER_CASES,
                         ids=["-".join([layout, *map(str, values.values())]) for layout, values in EAGER_CASES])
def test_eager_block_saves_what_the_planner_counts(layout: str, values: dict[str, Any]) -> None:
    """Exact to the byte: every term (norms' fp32 copies, the all-gathered inputs TP's column-parallel linears
    save, the row-parallel partial sums selective checkpointing saves, log-sum-exp per head) is in the formula."""
    eager = {**values, "compile": False, "fused_loss": False}
    measured = measured_block_bytes_per_token(layout, **eager)
    predicted = saved_activation_bytes_per_token_per_layer(LAYOUTS[layout](num_layers=2), knobs(SEQ_LENGTHS[0],
                                                                                                   **eager))
    assert measured == pytest.approx(predicted, rel=1e-3)


def partitioned_as_inductor(graph: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
    """A ``torch.compile`` backend: Inductor's ``compile_fx`` (its decompositions, joint-graph passes and min-cut
    partitioner), each partitioned graph then run as it is instead of through Inductor's code generation.

    What a compiled block saves for backward is the forward graph's outputs, which the partitioner fixes before
    code is generated; the code Inductor would generate here is C++ for the CPU, a GPU's is Triton. Both ways save
    the same storages for every layout below, to the byte (the backend against ``backend="inductor"``), the latter
    in some 60 CPU-seconds of C++ compilation and this in under 10."""
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.output_code import MockFXGraphCacheOutput

    def run_as_graph(partitioned: torch.fx.GraphModule, inputs: Any, **_: Any) -> MockFXGraphCacheOutput:
        def boxed(arguments: list[Any]) -> Any:  # Inductor's calling convention: the caller's list is consumed
            values = list(arguments)
            arguments.clear()
            return partitioned(*values)

        return MockFXGraphCacheOutput(gm=boxed)

    return compile_fx(graph, example_inputs, inner_compile=run_as_graph)


def compiled_block_bytes(arch: ModelArchitecture, seq_len: int) -> int:
    """Distinct storages a compiled block saves for backward (bf16, parameters and RoPE tables aside)."""
    torch.manual_seed(0)
    block = DecoderLayer(arch).to(torch.bfloat16)
    cos, sin = (table.to(torch.bfloat16) for table in rope_tables(seq_len, arch.effective_head_dim, arch.rope_theta,
                                                                   arch.rope_scaling))
    mask = None
    if arch.window(0) is not None:  # its mask is made once for every windowed block: not this block's
        positions = torch.arange(seq_len)
        mask = additive_mask(dense_positioned_mask(positions, positions, None, arch.window(0)), torch.bfloat16)
    constant = (*block.parameters(), cos, sin) if mask is None else (*block.parameters(), cos, sin, mask)
    shared = {tensor.untyped_storage().data_ptr() for tensor in constant}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in shared:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    compiled = torch.compile(block, backend=partitioned_as_inductor, dynamic=False)
    x = torch.randn(MICRO_BATCH, seq_len, arch.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), dryrun.attention_as_a_gpu_keeps_it():
        out = compiled(x, cos, sin, mask)
    out.float().square().mean().backward()  # the saved tensors are used: backward runs
    assert x.grad is not None and x.grad.shape == x.shape
    return sum(saved.values())


@pytest.mark.slow
@pytest.mark.parametrize("layout", [layout for layout in LAYOUTS if layout != "smollm3"])  # its block 0 is Llama's
def test_compiled_block_saves_what_the_planner_counts(layout: str) -> None:
    """Inductor's partitioner keeps each norm's input and inverse RMS, q/k/v and attention's output, gate, up and
    their product (it recomputes the norms' fp32 copies and silu): far less than an eager block, and what the planner
    counts."""
    arch = LAYOUTS[layout](num_layers=1)
    # One sequence length (each one is a compile): everything a compiled block saves grows with the tokens, so
    # its bytes per token are the planner's with no constant to difference away (a constant would fail this).
    measured = compiled_block_bytes(arch, SEQ_LENGTHS[0]) / (MICRO_BATCH * SEQ_LENGTHS[0])
    compiled = knobs(SEQ_LENGTHS[0], activation_checkpointing="none", compile=True)
    assert measured == pytest.approx(saved_activation_bytes_per_token_per_layer(arch, compiled), rel=1e-3)
    eager = saved_activation_bytes_per_token_per_layer(arch, compiled.model_copy(update={"compile": False}))
    assert measured < 0.75 * eager
