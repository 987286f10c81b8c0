"""What ``torch.compile`` saves of the non-matmul work, counted op by op on the trainer's eager block.

The planner counts the non-matmul HBM bytes of a compiled block (``btk.planner.throughput``:
``block_elementwise_bytes_per_token``, every norm, RoPE, SwiGLU and residual add fused into one read and one
write per element and pass) and multiplies their time by ``eager_overhead_factor`` without compile. This
script counts what the trainer's eager block (``btk_trainer.model.DecoderLayer``) actually reads and writes:
every ATen op of one forward and backward that is neither a matmul nor attention, its inputs' and outputs'
bytes, on fake tensors (no memory, no compute), at the shape of every model of the calibration set. It prints,
per model, the eager bytes per token and layer, the planner's compiled count and their ratio; then the fitted
``eager_overhead_factor`` beside the ratios, and what each part of the block (a norm, RoPE, SwiGLU) moves per
element in eager. ``docs/calibration.md`` quotes it.

Run: ``PYTHONPATH=containers:. .venv/bin/python benchmarks/eager_bytes.py`` (about five seconds).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from btk_trainer.model import DecoderLayer, RMSNorm, apply_rope, rope_tables
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn import functional
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from btk.knobs import TrainingKnobs
from btk.planner.calibration import load_points
from btk.planner.throughput import FITTED_CONSTANTS, block_elementwise_bytes_per_token
from btk.profile import ModelArchitecture

TOKENS = 256
"""Tokens of the counted micro-batch: bytes per token do not depend on it but for the RoPE tables' casts."""
NOT_ELEMENTWISE = {
    # matmuls and attention: timed by FLOPs, not bytes
    "mm", "bmm", "addmm", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    # views and allocations: no bytes moved
    "view", "_unsafe_view", "t", "transpose", "expand", "detach", "alias", "permute", "unsqueeze", "squeeze",
    "slice", "select", "split", "as_strided", "unbind", "empty", "empty_like", "empty_strided", "zeros", "zeros_like",
    "ones_like", "full_like", "new_empty_strided", "new_zeros", "lift_fresh",
}


class ElementwiseBytes(TorchDispatchMode):
    """Sums the bytes each non-matmul op reads and writes (its tensor arguments and results)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch's TorchDispatchMode.__init__ is unannotated
        self.bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func.namespace == "aten" and func._overloadpacket.__name__ not in NOT_ELEMENTWISE:
            tensors = [value for value in tree_flatten((args, kwargs, out))[0] if isinstance(value, torch.Tensor)]
            self.bytes += sum(tensor.numel() * tensor.element_size() for tensor in tensors)
        return out


def eager_bytes_per_token_and_layer(arch: ModelArchitecture, *, fake: bool = True) -> float:
    """One eager block's forward and backward, bf16: its non-matmul bytes per token (on fake tensors unless
    ``fake`` is False: then on real CPU tensors, for a small ``arch``)."""
    cos, sin = rope_tables(TOKENS, arch.effective_head_dim, arch.rope_theta, arch.rope_scaling)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext():
            layer = DecoderLayer(arch)
            hidden = torch.randn(1, TOKENS, arch.hidden_size, requires_grad=True)
            with ElementwiseBytes() as counted:
                out = layer(hidden, cos, sin)
                out.backward(torch.ones_like(out))
    finally:
        torch.set_default_dtype(default)
    return float(counted.bytes / TOKENS)


def compiled_bytes_per_token_and_layer(arch: ModelArchitecture) -> float:
    """The planner's count for one compiled block's forward and backward (no recompute)."""
    knobs = TrainingKnobs(micro_batch_size=1, seq_len=TOKENS, activation_checkpointing="none")
    return block_elementwise_bytes_per_token(arch, knobs)


def component_bytes_per_element(width: int = 1024) -> dict[str, float]:
    """The eager bytes of one forward and backward of each part of the block, per element of the width it runs
    over (the norm: the hidden size; RoPE: q's and k's; SwiGLU: the FFN's), on real CPU tensors."""
    heads, head_dim = width // 64, 64
    cos, sin = rope_tables(TOKENS, head_dim, 10000.0, None)
    parts: dict[str, Any] = {
        "norm": (RMSNorm(width, 1e-5).to(torch.bfloat16), 1),
        "rope": (lambda x: apply_rope(x.view(1, TOKENS, heads, head_dim).transpose(1, 2), cos, sin), 1),
        "swiglu": (lambda gate, up: functional.silu(gate) * up, 2),
    }
    counts = {}
    for name, (part, inputs) in parts.items():
        values = [torch.randn(1, TOKENS, width, dtype=torch.bfloat16).requires_grad_() for _ in range(inputs)]
        with ElementwiseBytes() as counted:
            out = part(*values)
            out.backward(torch.ones_like(out))
        counts[name] = counted.bytes / (TOKENS * width)
    return counts


def calibration_models() -> dict[str, ModelArchitecture]:
    """Every model of the calibration set, smallest first."""
    models: dict[str, ModelArchitecture] = {}
    for point in load_points():
        if point.architecture.window(0) is None:  # a windowed block needs its mask: none is in the set
            models.setdefault(point.model, point.architecture)
    return dict(sorted(models.items(), key=lambda item: item[1].parameter_count))


def main() -> None:
    print(f"{'model':<28} {'hidden':>6} {'ffn':>6} {'eager B/token/layer':>20} {'compiled (planner)':>19} ratio")
    ratios = []
    for name, arch in calibration_models().items():
        eager, compiled = eager_bytes_per_token_and_layer(arch), compiled_bytes_per_token_and_layer(arch)
        ratios.append(eager / compiled)
        print(f"{name:<28} {arch.hidden_size:>6} {arch.ffn_hidden_size:>6} {eager:>20,.0f} {compiled:>19,.0f} "
              f"{eager / compiled:.2f}x")
    print(f"eager / compiled bytes over {len(ratios)} models: {min(ratios):.2f}x to {max(ratios):.2f}x; "
          f"fitted eager_overhead_factor (time): {FITTED_CONSTANTS.eager_overhead_factor:.3f}")
    parts = ", ".join(f"{name} {count:.0f}" for name, count in component_bytes_per_element().items())
    print(f"eager bytes per element, forward and backward: {parts}")


if __name__ == "__main__":
    main()
