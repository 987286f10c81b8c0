"""Float8 matmuls without a GPU: torch's native emulation, to the result oneDNN's kernel gives, oneDNN left on."""

from __future__ import annotations

import pytest
import torch
from btk_trainer.cpu_float8 import use_native_float8_matmul_on_cpu


@pytest.mark.skipif(torch.cuda.is_available(), reason="installed only where no GPU is present")
def test_cpu_float8_matmul_is_the_upcast_product_and_leaves_onednn_on() -> None:
    use_native_float8_matmul_on_cpu()
    use_native_float8_matmul_on_cpu()  # idempotent: one wrapper
    assert getattr(torch._scaled_mm, "_btk_native_on_cpu", False)
    assert not getattr(torch._scaled_mm.__wrapped__, "_btk_native_on_cpu", False)  # type: ignore[attr-defined]
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(64, 32, generator=generator).to(torch.float8_e4m3fn)
    b = torch.randn(48, 32, generator=generator).to(torch.float8_e4m3fn).t()
    scale_a, scale_b = torch.tensor(0.5), torch.tensor(2.0)
    out = torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.float32)
    expected = (a.float() @ b.float()) * (scale_a * scale_b)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-5)
    assert torch.backends.mkldnn.enabled  # switched off for the call only
