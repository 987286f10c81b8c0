"""Tensor parallelism on the newer block layouts (CPU, gloo, 2 processes); run as a script, results as JSON.

    python tests/trainer/architecture_tp_worker.py WORKDIR

For each toy architecture (Mistral NeMo's wide heads, Qwen3's per-head QK-norm, OLMo 2's
whole-projection QK-norm and post-sublayer norms, Granite's multipliers, SmolLM3's block without
RoPE) and each activation-checkpointing mode, both ranks build the model with TP=2 (one
data-parallel rank, sequence parallelism, loss-parallel head) and run one forward/backward on the
same batch; rank 0 also runs the plain model on it. Both start from the same weights
(``Decoder.init_weights`` fills every layout alike), so the loss and every gradient must agree up to
the order of sums. Rank 0 writes ``WORKDIR/result.json``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# Run as a script, outside pytest: its pythonpath setting does not reach this process.
sys.path[:0] = [str(HERE.parents[1] / "containers"), str(HERE.parents[1]), str(HERE)]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from trainer_fixtures import (  # noqa: E402
    RANK_START_METHOD,
    tiny_gemma2,
    tiny_gemma3,
    tiny_granite,
    tiny_mistral_nemo,
    tiny_olmo2,
    tiny_qwen3,
    tiny_smollm3,
)

from btk.knobs import TrainingKnobs  # noqa: E402
from btk.profile import ModelArchitecture  # noqa: E402

ARCHITECTURES = {"mistral-nemo": tiny_mistral_nemo(), "qwen3": tiny_qwen3(), "olmo2": tiny_olmo2(),
                 "granite": tiny_granite(), "smollm3": tiny_smollm3(), "gemma2": tiny_gemma2(),
                 "gemma3": tiny_gemma3(num_kv_heads=2)}
# (activation checkpointing, compile backend): eager, and the GPU's compiled path traced by aot_eager.
MODES = (("none", None), ("selective", None), ("full", None), ("selective", "aot_eager"))
SEED = 5


def _batch(arch: ModelArchitecture) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(11)
    tokens = torch.randint(0, arch.vocab_size, (4, 32), generator=generator)
    return tokens, torch.randint(0, arch.vocab_size, (4, 32), generator=generator)


def _clean(name: str) -> str:
    return name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")


def plain_grads(arch: ModelArchitecture) -> tuple[dict[str, torch.Tensor], float]:
    from btk_trainer.model import Decoder

    model = Decoder(arch)
    model.init_weights(SEED)
    tokens, targets = _batch(arch)
    loss = model(tokens, targets)
    loss.backward()
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}, float(loss)


def tensor_parallel_grads(
    arch: ModelArchitecture, mode: str, backend: str | None
) -> tuple[dict[str, torch.Tensor], float]:
    from btk_trainer.model import Decoder
    from btk_trainer.parallelize import build_mesh, mesh_shape, parallelize, train_context
    from torch.distributed.tensor import DTensor

    knobs = TrainingKnobs(micro_batch_size=4, seq_len=32, tensor_parallel=2, activation_checkpointing=mode,
                          compile=backend is not None, fused_loss=False)
    shape = mesh_shape(dist.get_world_size(), 1, knobs)
    mesh = build_mesh(shape, "cpu")
    with torch.device("meta"):
        model = Decoder(arch)
    compiled = {} if backend is None else {"compile_enabled": True, "compile_backend": backend}
    parallelize(model, knobs, mesh, shape, param_dtype=None, capability=None, fused_loss_enabled=False, **compiled)
    model.to_empty(device="cpu")
    model.init_weights(SEED)
    tokens, targets = _batch(arch)
    with train_context(shape):
        loss = model(tokens, targets)
        loss.backward()
    grads = {}
    for name, parameter in model.named_parameters():
        grad = parameter.grad
        if grad is not None:
            grads[_clean(name)] = (grad.full_tensor() if isinstance(grad, DTensor) else grad).detach().clone()
    return grads, float(loss)


def _compare(grads: dict[str, torch.Tensor], loss: float, reference: dict[str, torch.Tensor],
             reference_loss: float) -> dict[str, Any]:
    return {
        "loss_diff": abs(loss - reference_loss),
        "names_match": sorted(grads) == sorted(reference),
        "max_abs_diff": max(float((grads[key] - reference[key]).abs().max()) for key in reference),
        "qk_norm_grad": max((float(reference[key].abs().max()) for key in reference
                             if key.endswith(("q_norm.weight", "k_norm.weight"))), default=0.0),
    }


def run(workdir: Path) -> dict[str, Any]:
    import btk_trainer.parallelize as parallelize

    results: dict[str, Any] = {}
    for name, arch in ARCHITECTURES.items():
        reference, reference_loss = plain_grads(arch)
        for mode, backend in MODES:
            torch._dynamo.reset()
            grads, loss = tensor_parallel_grads(arch, mode, backend)
            results[f"{name}/{mode}/{backend or 'eager'}"] = _compare(grads, loss, reference, reference_loss)
        if arch.qk_norm == "head":  # the check can fail: per-head norms left out of the TP plan still run
            planned = parallelize._qk_norm_plan
            parallelize._qk_norm_plan = lambda arch: {}
            try:
                grads, loss = tensor_parallel_grads(arch, "none", None)
            finally:
                parallelize._qk_norm_plan = planned
            results[f"{name}/without_qk_norm_plan"] = _compare(grads, loss, reference, reference_loss)
    return results


def _worker(rank: int, world: int, port: int, workdir: str) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = run(Path(workdir))
        if rank == 0:
            (Path(workdir) / "result.json").write_text(json.dumps(result, indent=1))
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


if __name__ == "__main__":
    mp.start_processes(_worker, args=(2, free_port(), sys.argv[1]), nprocs=2, start_method=RANK_START_METHOD)
