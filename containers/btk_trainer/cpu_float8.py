"""Float8 matmuls on a machine without a GPU (tests, the dry run's real-tensor check): torch's own emulation.

On a CPU with AMX (Sapphire Rapids and later) torch hands ``torch._scaled_mm`` to oneDNN, whose float8 matmul
there is a reference kernel: 4.4 s for a 1024 x 256 x 1024 product that torch's native emulation (both
operands upcast, one matmul, the scales applied) computes in 30 ms, to the same bits on that product. oneDNN
is switched off for that call only: bf16 matmuls keep it (without it a bf16 matmul on the same CPU is some
2,000 times slower). A GPU never takes this path, and a compiled graph calls the operator itself.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

_WRAPPED = "_btk_native_on_cpu"


def use_native_float8_matmul_on_cpu() -> None:
    """Route CPU ``torch._scaled_mm`` calls (torchao's float8 linears) to torch's native emulation; idempotent.

    Installed only where no GPU is present, so GPU jobs run torch unchanged."""
    original = torch._scaled_mm
    if getattr(original, _WRAPPED, False) or torch.cuda.is_available():
        return

    @functools.wraps(original)
    def scaled_mm(mat1: torch.Tensor, mat2: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if mat1.device.type != "cpu" or torch.compiler.is_compiling():
            return original(mat1, mat2, *args, **kwargs)
        # The switch alone: torch.backends.mkldnn.flags() also sets oneDNN's TF32 and warns that it cannot.
        enabled = torch._C._get_mkldnn_enabled()
        torch._C._set_mkldnn_enabled(False)
        try:
            return original(mat1, mat2, *args, **kwargs)
        finally:
            torch._C._set_mkldnn_enabled(enabled)

    setattr(scaled_mm, _WRAPPED, True)
    torch._scaled_mm = scaled_mm  # type: ignore[assignment]  # torchao looks the function up at every call
