"""The GPU benchmark's pre-check: every GPU-only code path its cases take, run once on a toy model in seconds.

    python -m btk_trainer.gpu_precheck --precision bf16 --precision fp8_tensorwise [--json out.json]

A case of the benchmark spends minutes compiling and training; a path only a GPU takes that is broken
(a kernel the installed torch lacks for this GPU, a dtype the CUDA branch gets wrong) should fail in
seconds, before any case starts, and name itself. The paths, each on a toy decoder in bf16 on the GPU
against the same weights in fp32 on the CPU:

* ``attention``: causal attention through SDPA with the GPU's backends (cuDNN, flash, memory-efficient;
  :func:`btk_trainer.model.attention_backends`), and the fused loss's fp32 accumulation of the head
  weight's gradient (``torch.addmm(..., out_dtype=torch.float32)``, which only CUDA has);
* ``document mask``: ``flex_attention`` with a document block mask (``train.document_masking``, and
  every context-parallel rank), where the CPU attends through a dense mask;
* ``fp8_tensorwise`` / ``fp8_rowwise``: torchao's float8 linears (``_scaled_mm`` on cuBLASLt, SM 8.9 or
  newer) as :func:`btk_trainer.parallelize.apply_low_precision` swaps them in;
* ``mxfp8``: torchao's MXFP8 linears (SM 10.0 or newer: Blackwell); on an older GPU it is reported as
  not applicable, as the trainer's own precision check would refuse it there.

Each check compares the loss (within :data:`LOSS_TOLERANCE`, relative) and requires finite gradients
that point the CPU's way (cosine similarity at least :data:`MIN_GRADIENT_COSINE`). A failing check is
one line naming the path; the exit status is 1 when any fails.

Without a GPU every step up to the first CUDA call runs (imports, the toy models, their CPU references)
and the pre-check says so and exits 0 with ``--until-cuda``, 1 without it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from btk.errors import BtkError
from btk.files import write_atomically
from btk.knobs import PRECISIONS
from btk.profile import ModelArchitecture
from btk_trainer.model import Decoder

TOY = ModelArchitecture(num_layers=2, hidden_size=128, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=256,
                        vocab_size=512, tied_embeddings=False, max_context=1024)
"""Widths float8 and MXFP8 swap (multiples of 32), small enough that each check takes well under a second."""
BATCH, SEQ_LEN = 2, 256
#: bf16 (and float8) on the GPU against fp32 on the CPU: the losses of a toy at initialisation agree far closer.
LOSS_TOLERANCE = {"bf16": 0.02, "fp8_tensorwise": 0.05, "fp8_rowwise": 0.05, "mxfp8": 0.05}
MIN_GRADIENT_COSINE = 0.9
#: The compute capability each precision needs (the trainer's :func:`btk_trainer.parallelize.check_precision`).
NEEDS_CAPABILITY = {"fp8_tensorwise": (8, 9), "fp8_rowwise": (8, 9), "mxfp8": (10, 0)}


@dataclass(frozen=True)
class CheckResult:
    """One path's outcome: ``status`` passed, failed or not applicable (``detail`` says why)."""

    name: str
    status: str
    seconds: float
    detail: str


@dataclass(frozen=True)
class Check:
    """A path to run: the precision its linears take and whether attention is restricted to documents."""

    name: str
    precision: str
    documents: bool


def checks_for(precisions: Sequence[str]) -> list[Check]:
    """The attention paths always, then one check per low precision the cases use (with document masking)."""
    unknown = [precision for precision in precisions if precision not in PRECISIONS]
    if unknown:
        raise BtkError(f"--precision {unknown[0]}: one of {', '.join(PRECISIONS)}")
    found = [Check("attention", "bf16", False), Check("document mask", "bf16", True)]
    found += [Check(precision, precision, True) for precision in dict.fromkeys(precisions) if precision != "bf16"]
    return found


def toy_batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens, targets and documents (three per row, of unequal lengths) of one micro-batch, on the CPU."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, TOY.vocab_size, (BATCH, SEQ_LEN + 1), generator=generator)
    documents = torch.zeros(BATCH, SEQ_LEN, dtype=torch.int32)
    documents[:, SEQ_LEN // 5:] = 1
    documents[:, SEQ_LEN // 2:] = 2
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous(), documents


def toy_model(seed: int = 0) -> Decoder:
    model = Decoder(TOY)
    model.init_weights(seed)
    return model


def loss_and_gradients(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor], documents: bool,
                       device: torch.device) -> tuple[float, torch.Tensor]:
    """The loss of one forward and backward on ``device`` and every gradient, flattened to fp32 on the CPU."""
    tokens, targets, document_ids = (tensor.to(device) for tensor in batch)
    loss = model(tokens, targets, document_ids if documents else None)
    loss.backward()
    gradients = [parameter.grad.float().flatten().cpu() for parameter in model.parameters()
                 if parameter.grad is not None]
    return float(loss.detach()), torch.cat(gradients)


def reference(check: Check) -> tuple[float, torch.Tensor]:
    """The CPU's fp32 loss and gradients for ``check``'s batch: what the GPU's must match."""
    return loss_and_gradients(toy_model(), toy_batch(), check.documents, torch.device("cpu"))


def run_check(check: Check, expected: tuple[float, torch.Tensor], capability: tuple[int, int],
              device: str = "cuda") -> CheckResult:
    """``check`` in bf16 on ``device`` (the GPU; the tests' CPU) against ``expected`` (from :func:`reference`)."""
    needed = NEEDS_CAPABILITY.get(check.precision)
    if needed is not None and capability < needed:
        return CheckResult(check.name, "not applicable", 0.0,
                           f"needs compute capability {needed[0]}.{needed[1]}, this GPU has "
                           f"{capability[0]}.{capability[1]}")
    from btk_trainer.parallelize import apply_low_precision

    started = time.perf_counter()
    try:
        model = toy_model().to(device=device, dtype=torch.bfloat16)
        apply_low_precision(model, check.precision, fsdp_float8_all_gather=False, emulate_mxfp8=device != "cuda")
        loss, gradients = loss_and_gradients(model, toy_batch(), check.documents, torch.device(device))
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception as failure:  # any failure of the path is the finding, reported in one line
        first = (str(failure).strip().splitlines() or [""])[0]
        return CheckResult(check.name, "failed", time.perf_counter() - started, f"{type(failure).__name__}: {first}")
    seconds = time.perf_counter() - started
    expected_loss, expected_gradients = expected
    if not torch.isfinite(gradients).all():
        return CheckResult(check.name, "failed", seconds, "non-finite gradients")
    error = abs(loss - expected_loss) / abs(expected_loss)
    cosine = float(torch.nn.functional.cosine_similarity(gradients, expected_gradients, dim=0))
    detail = f"loss {loss:.5f} vs {expected_loss:.5f} on the CPU ({error:.2%}), gradient cosine {cosine:.4f}"
    passed = error <= LOSS_TOLERANCE[check.precision] and cosine >= MIN_GRADIENT_COSINE
    return CheckResult(check.name, "passed" if passed else "failed", seconds, detail)


def precheck(precisions: Sequence[str]) -> tuple[list[CheckResult], str | None]:
    """Every check's result on this machine's GPU; without one, ``([], why)`` once everything before the first
    CUDA call (the toy models and their CPU references) has run."""
    checks = checks_for(precisions)
    expected = {check.name: reference(check) for check in checks}
    if not torch.cuda.is_available():
        return [], (f"no CUDA device: stopping before the first CUDA call; {len(checks)} paths ready "
                    f"({', '.join(check.name for check in checks)}), their CPU references computed")
    capability = torch.cuda.get_device_capability()
    return [run_check(check, expected[check.name], capability) for check in checks], None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="btk_trainer.gpu_precheck", description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", action="append", default=[], help="a precision the cases use (repeatable)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--until-cuda", action="store_true",
                        help="without a GPU: exit 0 after the steps before the first CUDA call")
    args = parser.parse_args(argv)
    try:
        results, stopped = precheck(args.precision)
    except BtkError as error:
        print(f"btk-gpu-precheck: {error}", file=sys.stderr)
        return 2
    for result in results:
        print(f"btk-gpu-precheck: {result.name}: {result.status} in {result.seconds:.2f} s: {result.detail}")
    if stopped is not None:
        print(f"btk-gpu-precheck: {stopped}")
    if args.json is not None:
        record = {"stopped_before_cuda": stopped, "checks": [asdict(result) for result in results]}
        write_atomically(args.json, json.dumps(record, indent=2) + "\n")
    if stopped is not None:
        return 0 if args.until_cuda else 1
    return 1 if any(result.status == "failed" for result in results) else 0


if __name__ == "__main__":
    sys.exit(main())
