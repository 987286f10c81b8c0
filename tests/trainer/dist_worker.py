"""Multi-process CPU (gloo) scenarios for the trainer tests; run as a script, results as JSON.

    python tests/trainer/dist_worker.py SCENARIO WORKDIR [WORLD_SIZE]

Each scenario runs in ``WORLD_SIZE`` spawned processes (default 2) and rank 0 writes
``WORKDIR/result.json``. Kept in one process group per scenario so the suite stays fast.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
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
    masked,
    sigterm_after,
    tiny_gemma2,
    tiny_gemma3,
    tiny_spec,
)

from btk.hyperparameters import JobHyperparameters  # noqa: E402
from btk.knobs import TrainingKnobs  # noqa: E402
from btk.profile import ModelArchitecture, TrainingIntent  # noqa: E402


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def grads_for(
    spec: JobHyperparameters, data_dir: Path, compile_backend: str | None = None,
    capability: tuple[int, int] | None = None,
) -> tuple[dict[str, torch.Tensor], float, bool]:
    """Full gradients after one accumulated step; also whether parameters are really sharded.

    ``compile_backend``: compile every block and the loss with this backend (``fullgraph=True``).
    """
    from btk_trainer.data import ResumableSampler, TokenShards
    from btk_trainer.model import Decoder
    from btk_trainer.parallelize import build_mesh, data_parallel_rank, mesh_shape, parallelize, train_context
    from btk_trainer.train import forward_backward
    from torch.distributed.tensor import DTensor

    knobs = spec.knobs
    shape = mesh_shape(dist.get_world_size(), 1, knobs)
    mesh = build_mesh(shape, "cpu")
    with torch.device("meta"):
        model = Decoder(spec.architecture)
    compiled = {} if compile_backend is None else {
        "compile_enabled": True, "fused_loss_enabled": True, "compile_backend": compile_backend}
    parallelize(model, knobs, mesh, shape, param_dtype=None, capability=capability, **compiled)
    model.to_empty(device="cpu")
    model.init_weights(spec.job.seed)
    weight = model.model.layers[0].mlp.up_proj.weight
    sharded = isinstance(weight, DTensor) and weight.to_local().shape[0] < weight.shape[0]
    windows = TokenShards(data_dir, knobs.seq_len)
    dp_rank, dp_size = data_parallel_rank(mesh)
    sampler = ResumableSampler(len(windows), micro_batch_size=knobs.micro_batch_size, dp_rank=dp_rank,
                               dp_size=dp_size, seed=spec.job.seed)
    loss = forward_backward(model, windows, sampler, torch.device("cpu"), knobs.gradient_accumulation_steps,
                            defer_all_reduce=shape.dp_replicate > 1, context=lambda: train_context(shape))
    dist.all_reduce(loss)
    grads = {}
    for name, parameter in model.named_parameters():
        grad = parameter.grad
        name = name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")
        grads[name] = (grad.full_tensor() if isinstance(grad, DTensor) else grad).detach().clone()
    return grads, float(loss) / dist.get_world_size(), sharded


def check_init_from(workdir: Path) -> dict[str, Any]:
    """A Hugging Face checkpoint (tied Qwen2-style toy) loads into the sharded model exactly."""
    from btk_trainer.model import Decoder, export_hf
    from btk_trainer.parallelize import build_mesh, mesh_shape, parallelize
    from btk_trainer.train import load_pretrained
    from trainer_fixtures import tiny_qwen

    arch = tiny_qwen()
    source_dir = workdir / "hf_source"
    source = Decoder(arch)
    source.init_weights(seed=3, std=0.05)
    if dist.get_rank() == 0:
        export_hf(source.state_dict(), arch, source_dir, dtype=torch.float32)
    dist.barrier()
    knobs = TrainingKnobs(micro_batch_size=1, seq_len=32, compile=False, fused_loss=False)
    shape = mesh_shape(dist.get_world_size(), 1, knobs)
    with torch.device("meta"):
        model = Decoder(arch)
    parallelize(model, knobs, build_mesh(shape, "cpu"), shape, param_dtype=None, capability=None)
    model.to_empty(device="cpu")
    tied = model.weights_tied
    load_pretrained(model, source_dir)
    loaded = full_state(model)
    expected = source.state_dict()
    if dist.get_rank() != 0:
        return {}
    return {
        "tied": tied,
        "keys_match": sorted(k for k in loaded if k != "lm_head.weight")
        == sorted(k for k in expected if k != "lm_head.weight"),
        "equal": all(torch.equal(loaded[k], expected[k]) for k in loaded),
    }


def check_tp_training(workdir: Path, data_dir: Path) -> dict[str, Any]:
    """Full train() steps (clipping included) with TP=2 equal the data-parallel run on the same windows."""
    from btk_trainer.train import RunConfig, train

    plain = train(RunConfig(spec=tiny_spec(), data_dir=data_dir, max_steps=3, device="cpu", return_state=True))
    tp = train(RunConfig(spec=tiny_spec(tensor_parallel=2, micro_batch_size=4), data_dir=data_dir,
                         max_steps=3, device="cpu", return_state=True))
    a, b = plain.final_state or {}, tp.final_state or {}
    # fp8_tensorwise under TP (torchao's Float8Colwise/RowwiseParallel) against fp8 data parallel.
    fp8 = {"precision": "fp8_tensorwise", "activation_checkpointing": "selective"}
    fp8_plain = train(RunConfig(spec=tiny_spec(**fp8), data_dir=data_dir, max_steps=3, device="cpu",
                                capability=(8, 9)))
    fp8_tp = train(RunConfig(spec=tiny_spec(tensor_parallel=2, micro_batch_size=4, **fp8),
                             data_dir=data_dir, max_steps=3, device="cpu", capability=(8, 9)))
    # Document masking: the mask rides beside the sequence-parallel activations (TP=2) unchanged.
    masked_plain = train(RunConfig(spec=masked(tiny_spec()), data_dir=data_dir, max_steps=3, device="cpu"))
    masked_tp = train(RunConfig(spec=masked(tiny_spec(tensor_parallel=2, micro_batch_size=4)), data_dir=data_dir,
                                max_steps=3, device="cpu"))
    return {
        "masked_loss_diff": max(abs(masked_plain.losses[s] - masked_tp.losses[s]) for s in plain.losses),
        "masked_vs_plain_loss_diff": max(abs(masked_plain.losses[s] - plain.losses[s]) for s in plain.losses),
        "grad_norms": [[plain.grad_norms[s], tp.grad_norms[s]] for s in sorted(plain.grad_norms)],
        "loss_diff": max(abs(plain.losses[s] - tp.losses[s]) for s in plain.losses),
        "max_weight_diff": max(float((a[k] - b[k]).abs().max()) for k in a) if a else -1.0,
        "keys_match": sorted(a) == sorted(b),
        "fp8_loss_diff": max(abs(fp8_plain.losses[s] - fp8_tp.losses[s]) for s in fp8_plain.losses),
        "fp8_vs_plain_loss_diff": max(abs(fp8_plain.losses[s] - plain.losses[s]) for s in plain.losses),
    }


def check_low_precision_construction() -> dict[str, Any]:
    """fp8_tensorwise (fp8 all-gather over 2 shards) and mxfp8 survive meta -> FSDP2 -> to_empty -> init.

    The construction with torchao's real (GPU) settings, capability 10.0 passed in; training
    through the loop, MXFP8 emulated, runs in ``scenario_precisions``.
    """
    from btk_trainer.model import Decoder
    from btk_trainer.parallelize import build_mesh, float8_all_gather_enabled, mesh_shape, parallelize
    from torch.distributed.tensor import DTensor
    from trainer_fixtures import tiny_llama

    out: dict[str, Any] = {}
    for precision in ("fp8_tensorwise", "mxfp8"):
        knobs = TrainingKnobs(micro_batch_size=1, seq_len=32, precision=precision, compile=False, fused_loss=False)
        shape = mesh_shape(dist.get_world_size(), 1, knobs)
        with torch.device("meta"):
            model = Decoder(tiny_llama())
        parallelize(model, knobs, build_mesh(shape, "cpu"), shape, param_dtype=torch.bfloat16, capability=(10, 0),
                    compile_enabled=False, fused_loss_enabled=False)
        model.to_empty(device="cpu")
        model.init_weights(seed=5)
        block = model.model.layers[0].mlp.up_proj.weight
        head = model.lm_head.weight
        out[precision] = {
            "block_local": type(block.to_local() if isinstance(block, DTensor) else block).__name__,
            "head_local": type(head.to_local() if isinstance(head, DTensor) else head).__name__,
            "block_std": float(block.full_tensor().float().std()),
            "block_module": type(model.model.layers[0].mlp.up_proj).__name__,
            "all_gather_fp8": float8_all_gather_enabled(precision, shape),
        }
    return out


def check_checkpoint_protocol(workdir: Path) -> dict[str, Any]:
    """Two 'nodes' (both local rank 0): a shared checkpoint directory and node-local ones; agreement."""
    from btk_trainer import checkpoint
    from torch.distributed.fsdp import fully_shard

    from btk.errors import BtkError

    rank = dist.get_rank()
    model = fully_shard(torch.nn.Linear(8, 8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(2, 8)).sum().backward()
    optimizer.step()
    shared = workdir / "ckpt_shared"
    for step in (1, 2, 3):
        checkpoint.save(shared, step, model, optimizer, {"step": step}, local_rank=0, keep=2)
    node = workdir / f"ckpt_node{rank}"
    for step in (1, 2):
        checkpoint.save(node, step, model, optimizer, {"step": step}, local_rank=0, keep=2)
    dist.barrier()
    listing = {
        "shared": sorted(p.name for p in shared.iterdir()),
        "node0": sorted(p.name for p in (workdir / "ckpt_node0").iterdir()),
        "node0_files": sorted(p.name for p in (workdir / "ckpt_node0" / "step_00000002").iterdir()),
        "node1_files": sorted(p.name for p in (workdir / "ckpt_node1" / "step_00000002").iterdir()),
    }
    agreed = checkpoint.agreed_latest_checkpoint(shared)
    # A restart restores the merged S3 prefix onto every node: each node-local directory then holds every rank's files.
    if rank == 0:
        import shutil

        for source, target in ((workdir / "ckpt_node0", workdir / "ckpt_node1"),
                               (workdir / "ckpt_node1", workdir / "ckpt_node0")):
            shutil.copytree(source, target, dirs_exist_ok=True)
    dist.barrier()
    # Rank 1's node lost its newest checkpoint (cut off mid-upload): both ranks resume from step 1.
    if rank == 1:
        (node / checkpoint.step_dir_name(2) / checkpoint.COMPLETE).unlink()
    dist.barrier()
    partial = checkpoint.agreed_latest_checkpoint(node)
    if rank == 1:
        (node / checkpoint.step_dir_name(1) / checkpoint.COMPLETE).unlink()
    dist.barrier()
    try:
        checkpoint.agreed_latest_checkpoint(node)
        disjoint = "no error"
    except BtkError as error:
        disjoint = str(error)
    return {
        **listing,
        "shared_complete": [s for s, _ in checkpoint.complete_checkpoints(shared)],
        "agreed_shared": agreed[0] if agreed else None,
        "agreed_partial": partial[0] if partial else None,
        "disjoint_error": disjoint,
    }


def scenario_core(workdir: Path, data_dir: Path) -> dict[str, Any]:
    """Loss falls; parameters are sharded; AC modes and grad accumulation give the same gradients."""
    from btk_trainer.train import RunConfig, train

    out: dict[str, Any] = {}
    run = train(RunConfig(spec=tiny_spec(), data_dir=data_dir, max_steps=25, device="cpu"))
    out["losses"] = [run.losses[s] for s in sorted(run.losses)]

    reference, ref_loss, sharded = grads_for(tiny_spec(), data_dir)
    out["sharded"] = sharded
    out["ac"] = {}
    for mode in ("selective", "full"):
        grads, loss, _ = grads_for(tiny_spec(activation_checkpointing=mode), data_dir)
        out["ac"][mode] = {
            "max_abs_diff": max(float((grads[k] - reference[k]).abs().max()) for k in reference),
            "loss_diff": abs(loss - ref_loss),
        }
    # The GPU path compiles every block (fullgraph: a graph break fails) and the loss; aot_eager traces
    # the same forward and backward graphs on CPU without Inductor, under every AC mode.
    out["compiled"] = {}
    for mode in ("none", "selective", "full", "fp8_tensorwise"):
        precision = "fp8_tensorwise" if mode == "fp8_tensorwise" else "bf16"
        ac_spec = tiny_spec(activation_checkpointing="selective" if precision != "bf16" else mode,
                           precision=precision)
        capability = (8, 9) if precision != "bf16" else None
        eager, eager_loss, _ = ((reference, ref_loss, True) if mode == "none"
                                else grads_for(ac_spec, data_dir, capability=capability))
        from torch._dynamo.utils import counters

        torch._dynamo.reset()  # each mode compiles from scratch (the loss graph would be cached)
        graphs_before = counters["stats"]["unique_graphs"]
        grads, loss, _ = grads_for(ac_spec, data_dir, compile_backend="aot_eager", capability=capability)
        out["compiled"][mode] = {
            "graphs_compiled": counters["stats"]["unique_graphs"] - graphs_before,
            "max_abs_diff": max(float((grads[k] - eager[k]).abs().max()) for k in eager),
            "loss_diff": abs(loss - eager_loss),
            "names": sorted(grads) == sorted(eager),
        }
    big, big_loss, _ = grads_for(tiny_spec(micro_batch_size=2, gradient_accumulation_steps=1), data_dir)
    acc, acc_loss, _ = grads_for(tiny_spec(micro_batch_size=1, gradient_accumulation_steps=2), data_dir)
    # no_shard is the replicated mesh dim (as hybrid_shard across nodes): all-reduce deferred to the last
    # micro-batch must still give the full-shard gradients.
    replicated, replicated_loss, replicated_sharded = grads_for(
        tiny_spec(micro_batch_size=1, gradient_accumulation_steps=2, sharding="no_shard"), data_dir)
    out["no_shard_accumulation"] = {
        "max_abs_diff": max(float((replicated[k] - acc[k]).abs().max()) for k in acc),
        "loss_diff": abs(replicated_loss - acc_loss),
        "sharded": replicated_sharded,
    }
    out["accumulation"] = {
        "max_abs_diff": max(float((acc[k] - big[k]).abs().max()) for k in big),
        "max_abs_grad": max(float(big[k].abs().max()) for k in big),
        "loss_diff": abs(acc_loss - big_loss),
    }
    # TP=2 on 2 ranks leaves one data-parallel rank: give it both ranks' windows (4) to match.
    tp, tp_loss, _ = grads_for(tiny_spec(tensor_parallel=2, micro_batch_size=4), data_dir)
    out["init_from"] = check_init_from(workdir)
    out["tensor_parallel"] = {"max_abs_diff": max(float((tp[k] - reference[k]).abs().max()) for k in reference),
                              "loss_diff": abs(tp_loss - ref_loss)}
    # The GPU path under TP: sequence-parallel blocks compiled (selective and full AC) and the fused loss
    # under loss_parallel(), traced by aot_eager on CPU (full AC keeps attention there, see
    # keeps_attention_under_full_checkpointing).
    for case, mode in (("tensor_parallel_compiled", "selective"), ("tensor_parallel_compiled_full", "full")):
        torch._dynamo.reset()
        tp_compiled, tp_compiled_loss, _ = grads_for(
            tiny_spec(tensor_parallel=2, micro_batch_size=4, activation_checkpointing=mode), data_dir,
            compile_backend="aot_eager")
        out[case] = {"max_abs_diff": max(float((tp_compiled[k] - reference[k]).abs().max()) for k in reference),
                     "loss_diff": abs(tp_compiled_loss - ref_loss)}
    out["tp_training"] = check_tp_training(workdir, data_dir)
    out["low_precision"] = check_low_precision_construction()
    out["checkpoint_protocol"] = check_checkpoint_protocol(workdir)
    out["rescaled_accumulation"] = check_rescaled_accumulation(workdir, data_dir)
    out["fp8_training"] = check_fp8_training(workdir, data_dir)
    out["split_verification"] = check_split_verification(workdir, data_dir)
    out["init_is_the_models"] = check_training_init_is_the_models(data_dir)
    return out


def check_training_init_is_the_models(data_dir: Path) -> dict[str, Any]:
    """train()'s initial weights (sharded on 2 ranks; TP=2) equal ``Decoder.init_weights`` on one plain model."""
    from btk_trainer.model import Decoder
    from btk_trainer.train import RunConfig, train

    out: dict[str, Any] = {}
    layouts = {"sharded": tiny_spec(), "tensor_parallel": tiny_spec(tensor_parallel=2, micro_batch_size=4)}
    for label, spec in layouts.items():
        run = train(RunConfig(spec=spec, data_dir=data_dir, max_steps=0, device="cpu", return_state=True))
        plain = Decoder(spec.architecture)
        plain.init_weights(spec.job.seed)
        expected, initial = plain.state_dict(), run.final_state or {}
        out[label] = sorted(initial) == sorted(expected) and all(torch.equal(initial[k], expected[k]) for k in expected)
    return out


def check_split_verification(workdir: Path, data_dir: Path) -> dict[str, Any]:
    """Each rank hashes half the shards; a bit flipped in a shard rank 1 hashes stops both ranks alike."""
    import shutil

    from btk_trainer.data import TokenShards

    from btk.errors import BtkError

    corrupt = workdir / "ds_corrupt"
    if dist.get_rank() == 0:
        shutil.copytree(data_dir, corrupt)
        target = corrupt / "shard_00001.bin"
        data = bytearray(target.read_bytes())
        data[5] ^= 0x01
        target.write_bytes(bytes(data))
    dist.barrier()
    clean = TokenShards(data_dir, 32, verify="ranks")
    try:
        TokenShards(corrupt, 32, verify="ranks")
        error = ""
    except BtkError as raised:
        error = str(raised)
    errors: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    return {"shards": len(clean.manifest.shards), "errors": errors}


def check_fp8_training(workdir: Path, data_dir: Path) -> dict[str, Any]:
    """fp8_tensorwise / fp8_rowwise through the real loop on CPU (emulated _scaled_mm), against fp32.

    Tensorwise on 2 sharded ranks also all-gathers fp8 weights and precomputes their scales
    after every optimizer step, the GPU path exactly.
    """
    from btk_trainer.train import RunConfig, train

    def run(precision: str) -> tuple[list[float], dict[str, torch.Tensor]]:
        spec = tiny_spec(precision=precision, micro_batch_size=2)
        result = train(RunConfig(spec=spec, data_dir=data_dir, max_steps=12, device="cpu", capability=(8, 9),
                                 return_state=True))
        return [result.losses[s] for s in sorted(result.losses)], result.final_state or {}

    reference_losses, reference_state = run("bf16")  # fp32 parameters and compute on CPU
    out: dict[str, Any] = {"reference_losses": reference_losses}
    for precision in ("fp8_tensorwise", "fp8_rowwise"):
        losses, state = run(precision)
        out[precision] = {
            "losses": losses,
            "max_loss_diff": max(abs(a - b) for a, b in zip(losses, reference_losses, strict=True)),
            "weights_differ": any(not torch.equal(state[k], reference_state[k]) for k in reference_state),
        }
    return out


def check_rescaled_accumulation(workdir: Path, data_dir: Path) -> dict[str, Any]:
    """Knobs planned for 4 data-parallel ranks, run on 2: accumulation doubles, as if planned for 2."""
    from btk_trainer.train import RunConfig, train

    def final_weights(spec: JobHyperparameters) -> tuple[dict[str, torch.Tensor], int]:
        run = train(RunConfig(spec=spec, data_dir=data_dir, max_steps=2, device="cpu", return_state=True))
        return run.final_state or {}, len(run.metrics)

    planned_for_four, _ = final_weights(
        tiny_spec(micro_batch_size=1, gradient_accumulation_steps=1, job={"planned_data_parallel": 4}))
    planned_for_two, _ = final_weights(tiny_spec(micro_batch_size=1, gradient_accumulation_steps=2))
    unplanned, _ = final_weights(tiny_spec(micro_batch_size=1, gradient_accumulation_steps=1))
    return {
        "equal_to_planned_for_two": all(torch.equal(planned_for_four[k], planned_for_two[k]) for k in planned_for_two),
        "differs_from_plain": any(not torch.equal(planned_for_four[k], unplanned[k]) for k in unplanned),
    }


def _exported_names(directory: Path) -> list[str]:
    from safetensors import safe_open

    if not (directory / "model.safetensors").is_file():
        return []
    with safe_open(str(directory / "model.safetensors"), framework="pt") as handle:
        return sorted(handle.keys())


def scenario_resume(workdir: Path, data_dir: Path, seed: int) -> dict[str, Any]:
    """SIGTERM at random steps, resume, compare final weights with an uninterrupted run."""
    from btk_trainer.checkpoint import complete_checkpoints
    from btk_trainer.model import Decoder
    from btk_trainer.train import RunConfig, train

    steps = 8
    spec = tiny_spec(gradient_accumulation_steps=2, activation_checkpointing="selective")
    straight = train(RunConfig(spec=spec, data_dir=data_dir, max_steps=steps, device="cpu", return_state=True))
    reference = straight.final_state or {}
    out: dict[str, Any] = {"runs": []}
    stops = sorted(random.Random(seed).sample(range(1, steps), 3))
    for stop in stops:
        ckpt = workdir / f"ckpt_{stop}"
        # Only rank 0 gets the signal (nodes see SIGTERM at different times): every rank must stop with it.
        first = train(RunConfig(spec=spec, data_dir=data_dir, max_steps=steps, device="cpu",
                                checkpoint_dir=ckpt, on_step_end=sigterm_after(stop) if dist.get_rank() == 0 else None))
        views: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(views, [first.interrupted, first.steps_done])
        second = train(RunConfig(spec=spec, data_dir=data_dir, max_steps=steps, device="cpu",
                                 checkpoint_dir=ckpt, model_dir=workdir / f"model_{stop}", return_state=True))
        final = second.final_state or {}
        out["runs"].append({
            "stop": stop, "interrupted": first.interrupted, "first_steps": first.steps_done, "ranks": views,
            "resumed_from": second.resumed_from, "steps": second.steps_done,
            "kept": [step for step, _ in complete_checkpoints(ckpt)],
            "losses_after": {str(k): v for k, v in second.losses.items()},
            "bit_identical": sorted(final) == sorted(reference)
            and all(torch.equal(final[k], reference[k]) for k in reference),
            "max_abs_diff": max((float((final[k] - reference[k]).abs().max()) for k in reference), default=-1.0),
            "exported": sorted(p.name for p in (workdir / f"model_{stop}").iterdir())
            if (workdir / f"model_{stop}").is_dir() else [],
            "exported_names_are_hf": _exported_names(workdir / f"model_{stop}") == sorted(
                Decoder(spec.architecture).state_dict()),
        })
    out["straight_losses"] = {str(k): v for k, v in straight.losses.items()}
    return out


def scenario_context_parallel(workdir: Path, data_dir: Path) -> dict[str, Any]:
    """Whole train() steps (clipping included) with each sequence shared by ``cp`` ranks against the run without:
    the same windows (one global micro-batch of ``2 x world`` sequences in every layout), with and without document
    masking; and a run stopped under one degree and resumed under another, against the uninterrupted run."""
    from btk_trainer.train import RunConfig, train

    world = dist.get_world_size()
    steps = 4

    def run(spec: JobHyperparameters, **config: Any) -> Any:
        return train(RunConfig(spec=spec, data_dir=data_dir, max_steps=steps, device="cpu", return_state=True,
                               **config))

    def layout(cp: int, tp: int = 1, **knobs: Any) -> JobHyperparameters:
        return tiny_spec(context_parallel=cp, tensor_parallel=tp, micro_batch_size=2 * cp * tp, **knobs)

    def compared(reference: Any, other: Any) -> dict[str, Any]:
        a, b = reference.final_state or {}, other.final_state or {}
        # every step the other run took (a resumed run: those after its checkpoint)
        return {"loss_diff": max(abs(reference.losses[s] - other.losses[s]) for s in other.losses),
                "grad_norm_diff": max(abs(reference.grad_norms[s] - other.grad_norms[s]) for s in other.grad_norms),
                "max_weight_diff": max(float((a[k] - b[k]).abs().max()) for k in a) if a else -1.0,
                "keys_match": sorted(a) == sorted(b), "steps": [reference.steps_done, other.steps_done]}

    def gemma(spec: JobHyperparameters, arch: ModelArchitecture) -> JobHyperparameters:
        return spec.model_copy(update={"architecture": arch})

    # Gemma 2 (windowed blocks, soft caps) and Gemma 3 (the windowed blocks' own RoPE) with document masking.
    gemma2, gemma3 = tiny_gemma2(), tiny_gemma3(num_kv_heads=2)
    degrees = [cp for cp in (2, 4) if cp <= world]
    plain, masked_plain = run(layout(1)), run(masked(layout(1)))
    gemma2_plain, gemma3_masked_plain = run(gemma(layout(1), gemma2)), run(masked(gemma(layout(1), gemma3)))
    out: dict[str, Any] = {"degrees": degrees, "cases": {}}
    for cp in degrees:
        out["cases"][f"cp{cp}"] = compared(plain, run(layout(cp)))
        out["cases"][f"cp{cp}_masked"] = compared(masked_plain, run(masked(layout(cp))))
        out["cases"][f"cp{cp}_gemma2"] = compared(gemma2_plain, run(gemma(layout(cp), gemma2)))
        out["cases"][f"cp{cp}_gemma3_masked"] = compared(gemma3_masked_plain, run(masked(gemma(layout(cp), gemma3))))
        for mode in ("selective", "full"):  # the recompute gathers the keys and values again
            checkpointed = run(layout(cp, activation_checkpointing=mode))
            out["cases"][f"cp{cp}_{mode}_checkpointing"] = compared(plain, checkpointed)
    if world >= 4:  # composed with tensor parallelism (sequence-parallel norms between the attention layers)
        out["cases"]["cp2_tp2"] = compared(plain, run(layout(2, 2)))
        out["cases"]["cp2_tp2_masked"] = compared(masked_plain, run(masked(layout(2, 2))))
        # and with HSDP: the 4 ranks as 2 nodes, a sequence's 2 ranks the shard group, replicated across the nodes
        out["cases"]["cp2_hybrid_2_nodes"] = compared(plain, run(layout(2, sharding="hybrid_shard"), nnodes=2))
    # Resume across degrees: stopped at step 2 under the first layout, finished under the second.
    for first_cp, second_cp in ((degrees[-1], 1), (1, degrees[-1])):
        ckpt = workdir / f"ckpt_{first_cp}_{second_cp}"
        train(RunConfig(spec=layout(first_cp), data_dir=data_dir, max_steps=steps, device="cpu", checkpoint_dir=ckpt,
                        on_step_end=sigterm_after(2) if dist.get_rank() == 0 else None))
        resumed = run(layout(second_cp), checkpoint_dir=ckpt)
        case = compared(plain, resumed)
        case["resumed_from"] = resumed.resumed_from
        out["cases"][f"resume_cp{first_cp}_as_cp{second_cp}"] = case
    return out


PRECISIONS = ("bf16", "fp8_tensorwise", "fp8_rowwise", "mxfp8")
ARCHITECTURES = ("llama", "qwen")  # no bias, untied / q-k-v bias, tied


def precision_spec(precision: str, arch: str) -> JobHyperparameters:
    """Selective AC (the GPU default's recompute path), accumulation 2, one checkpoint by SIGTERM at step 2."""
    from trainer_fixtures import tiny_qwen

    spec = tiny_spec(precision=precision, gradient_accumulation_steps=2, activation_checkpointing="selective",
                     job={"checkpoint_interval_steps": 100})
    return spec.model_copy(update={"architecture": tiny_qwen()}) if arch == "qwen" else spec


PRECISION_STEPS = 4


def scenario_precisions_save(workdir: Path, data_dir: Path) -> dict[str, Any]:
    """Every precision x {Llama, Qwen}: an uninterrupted run (exported), and a run stopped at step 2 (saved).

    The stopped runs are resumed by :func:`scenario_precisions_resume` in fresh processes. On
    CPU the fp8 matmuls are torch's ``_scaled_mm`` emulation and MXFP8 torchao's emulation.
    """
    from btk_trainer.train import RunConfig, train

    out: dict[str, Any] = {}
    for precision in PRECISIONS:
        for arch in ARCHITECTURES:
            name, spec = f"{precision}-{arch}", precision_spec(precision, arch)
            straight = train(RunConfig(spec=spec, data_dir=data_dir, max_steps=PRECISION_STEPS, device="cpu",
                                       capability=(10, 0), model_dir=workdir / f"straight_{name}", return_state=True))
            if dist.get_rank() == 0:
                torch.save(straight.final_state, workdir / f"straight_{name}.pt")
            first = train(RunConfig(spec=spec, data_dir=data_dir, max_steps=PRECISION_STEPS, device="cpu",
                                    capability=(10, 0), checkpoint_dir=workdir / f"ckpt_{name}",
                                    on_step_end=sigterm_after(2) if dist.get_rank() == 0 else None))
            out[name] = {"straight_losses": [straight.losses[s] for s in sorted(straight.losses)],
                         "stopped_at": first.steps_done, "saved": first.saved_step}
    return out


def scenario_precisions_resume(workdir: Path, data_dir: Path) -> dict[str, Any]:
    """Resume each stopped run in this fresh process; the finished weights must equal the uninterrupted run's."""
    from btk_trainer.train import RunConfig, train

    out: dict[str, Any] = {}
    for precision in PRECISIONS:
        for arch in ARCHITECTURES:
            name, spec = f"{precision}-{arch}", precision_spec(precision, arch)
            resumed = train(RunConfig(spec=spec, data_dir=data_dir, max_steps=PRECISION_STEPS, device="cpu",
                                      capability=(10, 0), checkpoint_dir=workdir / f"ckpt_{name}",
                                      model_dir=workdir / f"resumed_{name}", return_state=True))
            final = resumed.final_state or {}
            reference = torch.load(workdir / f"straight_{name}.pt")
            out[name] = {
                "resumed_from": resumed.resumed_from, "steps": resumed.steps_done,
                "losses": {str(k): v for k, v in resumed.losses.items()},
                "bit_identical": sorted(final) == sorted(reference)
                and all(torch.equal(final[k], reference[k]) for k in reference),
            }
    return out


def _killed_mid_write(rank: int, workdir: str, data_dir: str, port: int, case: str) -> None:
    """One rank trains with a checkpoint every 2 steps and is SIGKILLed inside a checkpoint write.

    ``write``: after step 4's DCP and RNG files landed (written in the background), before manifest and marker.
    ``prune``: while step 6's save prunes step 4 (keep 1), between its marker and its files.
    """
    import shutil

    from btk_trainer import checkpoint
    from btk_trainer.train import RunConfig, train

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1",
                       "LOCAL_RANK": "0"})
    torch.set_num_threads(1)
    real_describe, real_rmtree = checkpoint.describe_files, shutil.rmtree

    def describe_then_die(files: list[Path]) -> Any:  # DCP's files are written when their entries are made
        if case == "write" and files and files[0].parent.name == ".step_00000004.tmp":
            os.kill(os.getpid(), signal.SIGKILL)
        return real_describe(files)

    def rmtree_then_die(path: Any, *args: Any, **kwargs: Any) -> None:
        if case == "prune" and str(path).endswith("step_00000004"):
            os.kill(os.getpid(), signal.SIGKILL)
        real_rmtree(path, *args, **kwargs)

    # the kill-mid-write test swaps these two for versions that die partway (the process is thrown away)
    checkpoint.describe_files = describe_then_die
    checkpoint.shutil.rmtree = rmtree_then_die
    spec = tiny_spec(job={"checkpoint_interval_steps": 2, "keep_last_checkpoints": 1 if case == "prune" else 2})
    train(RunConfig(spec=spec, data_dir=Path(data_dir), max_steps=8, device="cpu",
                    checkpoint_dir=Path(workdir) / f"ckpt_{case}"))


LOW_PRECISIONS = ("fp8_tensorwise", "fp8_rowwise", "mxfp8")


def parity_cases(*, low_precision_only: bool = False) -> dict[str, dict[str, Any]]:
    """Knobs of every case :func:`scenario_parity` runs: each AC mode under data and tensor parallelism, and
    every low precision the CPU emulates, for Llama (GQA, no bias, untied) and Qwen (bias, tied).

    ``low_precision_only``: the fp8 and MXFP8 cases alone."""
    cases: dict[str, dict[str, Any]] = {}
    for arch in ARCHITECTURES:
        for tp in () if low_precision_only else (1, 2):
            for mode in ("none", "selective", "full"):
                cases[f"{arch}-bf16-{mode}-tp{tp}"] = {"activation_checkpointing": mode, "tensor_parallel": tp}
        for precision in LOW_PRECISIONS:
            cases[f"{arch}-{precision}-selective-tp1"] = {"precision": precision,
                                                          "activation_checkpointing": "selective"}
        cases[f"{arch}-fp8_tensorwise-selective-tp2"] = {"precision": "fp8_tensorwise", "tensor_parallel": 2,
                                                         "activation_checkpointing": "selective"}
    return cases


PARITY_STEPS = 3
# The trainer's optimizer (btk_trainer.train.build_optimizer): AdamW, torchtitan's betas and eps.
REFERENCE_BETAS = (0.9, 0.95)
REFERENCE_EPS = 1e-8


def parity_spec(name: str, knobs: dict[str, Any]) -> JobHyperparameters:
    """A parity case's job: 2 micro-batches per step, a checkpoint every 2 steps, one global batch for every layout."""
    from trainer_fixtures import tiny_qwen

    batch = 4 if knobs.get("tensor_parallel", 1) == 2 else 2  # same global batch: TP=2 has 1 data rank
    spec = tiny_spec(micro_batch_size=batch, gradient_accumulation_steps=2, job={"checkpoint_interval_steps": 2},
                     **knobs)
    return spec.model_copy(update={"architecture": tiny_qwen()}) if name.startswith("qwen") else spec


def reference_low_precision(model: torch.nn.Module, precision: str) -> None:
    """torchao's recipe for ``precision`` on every linear of the blocks (the head stays exact), applied directly.

    Every dimension of the tiny models is a multiple of 32, so the trainer's filter (dimensions
    the kernels take) passes all of them too.
    """
    if precision == "bf16":
        return

    def in_blocks(module: torch.nn.Module, fqn: str) -> bool:
        return isinstance(module, torch.nn.Linear) and fqn.startswith("model.layers.")

    if precision != "mxfp8":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        recipe = Float8LinearConfig.from_recipe_name(precision.removeprefix("fp8_"))
        convert_to_float8_training(model, config=recipe, module_filter_fn=in_blocks)
        return
    from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    for fqn, linear in [(fqn, module) for fqn, module in model.named_modules() if in_blocks(module, fqn)]:
        parent, _, child = fqn.rpartition(".")
        emulated = MXFP8Linear(linear.in_features, linear.out_features, bias=linear.bias is not None,
                               kernel_preference=KernelPreference.EMULATED)
        emulated.load_state_dict(linear.state_dict())
        setattr(model.get_submodule(parent), child, emulated)


def reference_learning_rate(step: int, intent: TrainingIntent, total: int) -> float:
    """The schedule from its definition: linear warmup to the peak, cosine to ``min_learning_rate_ratio`` of it."""
    if intent.warmup_steps and step <= intent.warmup_steps:
        return float(intent.learning_rate * step / intent.warmup_steps)
    progress = min(1.0, (step - intent.warmup_steps) / max(1, total - intent.warmup_steps))
    floor = intent.min_learning_rate_ratio
    return float(intent.learning_rate * (floor + (1 - floor) * (1 + math.cos(math.pi * progress)) / 2))


Batch = tuple[torch.Tensor, torch.Tensor]


def token_loss_rounding(low: torch.nn.Module, exact: torch.nn.Module, batches: list[Batch]) -> float:
    """RMS over ``batches``' tokens of the change the low-precision format makes to each token's loss (same weights)."""
    from torch.nn.functional import cross_entropy

    changes = []
    with torch.no_grad():
        for inputs, targets, _documents in batches:
            per_token = [cross_entropy(model(inputs).float().flatten(0, 1), targets.flatten(), reduction="none")
                         for model in (low, exact)]
            changes.append(per_token[0] - per_token[1])
    return float(torch.cat(changes).double().square().mean().sqrt())


def reference_training(spec: JobHyperparameters, dp_size: int, steps: int) -> tuple[
        dict[str, Any], dict[str, dict[str, torch.Tensor]]]:
    """The training each parity case must reproduce, written out plainly in this one process.

    One unsharded model, initialised by ``Decoder.init_weights`` (the trainer's sharded and TP
    weights start equal to it: ``check_training_init_is_the_models``), the precision's torchao
    recipe applied directly; the synthetic windows each data-parallel rank reads, each rank's
    micro-batch its own forward and backward (fp8 scales cover one rank's batch, as in the
    trainer), the loss divided by the micro-batch and rank counts; torch's single-tensor
    AdamW, ``clip_grad_norm_``, and :func:`reference_learning_rate`.

    Returns the losses, gradient norms and learning rates, and what the tests' rounding bounds
    are made of: tokens per step, parameter count, how many gradient elements carry the first
    gradient's norm ((Σg²)²/Σg⁴) and, for a low precision, the RMS change of a token's loss it
    makes (:func:`token_loss_rounding`, first step); also the initial and final weights.
    """
    import copy

    from btk_trainer.data import ResumableSampler, next_batch
    from btk_trainer.model import Decoder
    from btk_trainer.train import SyntheticWindows

    knobs, intent, seed = spec.knobs, spec.training, spec.job.seed
    exact = Decoder(spec.architecture)
    exact.init_weights(seed)
    initial = {name: tensor.clone() for name, tensor in exact.state_dict().items()}
    model = copy.deepcopy(exact)
    reference_low_precision(model, knobs.precision)
    windows = SyntheticWindows(spec.architecture.vocab_size, knobs.seq_len, seed=seed)
    samplers = [ResumableSampler(len(windows), micro_batch_size=knobs.micro_batch_size, dp_rank=rank,
                                 dp_size=dp_size, seed=seed) for rank in range(dp_size)]
    accumulation = knobs.gradient_accumulation_steps
    steps_batches = [[[next_batch(windows, sampler, torch.device("cpu")) for sampler in samplers]
                      for _ in range(accumulation)] for _ in range(steps)]
    parameters = list(model.parameters())
    optimizer = torch.optim.AdamW(
        [{"params": [p for p in parameters if p.ndim >= 2], "weight_decay": intent.weight_decay},
         {"params": [p for p in parameters if p.ndim < 2], "weight_decay": 0.0}],
        lr=intent.learning_rate, betas=REFERENCE_BETAS, eps=REFERENCE_EPS, foreach=False, fused=False)
    out: dict[str, Any] = {
        "losses": [], "grad_norms": [], "learning_rates": [], "betas": list(REFERENCE_BETAS),
        "tokens_per_step": dp_size * accumulation * knobs.micro_batch_size * knobs.seq_len,
        "parameters": sum(p.numel() for p in parameters),
        "token_loss_rounding": 0.0 if knobs.precision == "bf16" else token_loss_rounding(
            model, exact, [batch for ranks in steps_batches[0] for batch in ranks]),
    }
    for step, micro_batches in enumerate(steps_batches, start=1):
        lr = reference_learning_rate(step, intent, steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for ranks in micro_batches:
            for inputs, targets, _documents in ranks:
                loss = model(inputs, targets) / accumulation
                (loss / dp_size).backward()
                loss_sum += float(loss.detach()) / dp_size
        if step == 1:
            squares = torch.cat([p.grad.detach().double().flatten() for p in parameters if p.grad is not None]).square()
            out["gradient_participation"] = float(squares.sum() ** 2 / squares.square().sum())
        out["grad_norms"].append(float(torch.nn.utils.clip_grad_norm_(parameters, intent.max_grad_norm)))
        optimizer.step()
        out["losses"].append(loss_sum)
        out["learning_rates"].append(lr)
    final = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    return out, {"initial": initial, "final": final}


def scenario_parity(workdir: Path, *, low_precision_only: bool = False) -> dict[str, Any]:
    """Every case of :func:`parity_cases` for a few steps on synthetic tokens, and its :func:`reference_training`.

    Checkpoints every 2 steps (asynchronous where the trainer saves so), so saving is on the path.
    Rank 0 writes each case's final weights to ``trainer_<case>.pt``; the references (one per
    architecture, precision and data-parallel layout, split between the ranks) write theirs to
    ``reference_<key>.pt`` ({"initial": …, "final": …}). The result names the instruction set
    ATen's kernels ran on (``ATEN_CPU_CAPABILITY`` chooses it).
    """
    from btk_trainer.checkpoint import verify_checkpoint
    from btk_trainer.train import RunConfig, train

    rank, world = dist.get_rank(), dist.get_world_size()
    cases: dict[str, Any] = {}
    references: dict[str, tuple[JobHyperparameters, int]] = {}
    for name, knobs in parity_cases(low_precision_only=low_precision_only).items():
        spec = parity_spec(name, knobs)
        dp_size = world // spec.knobs.tensor_parallel
        key = f"{name.split('-')[0]}-{spec.knobs.precision}-dp{dp_size}"
        references.setdefault(key, (spec, dp_size))
        result = train(RunConfig(spec=spec, max_steps=PARITY_STEPS, device="cpu", capability=(10, 0),
                                 checkpoint_dir=workdir / f"ckpt_{name}", return_state=True))
        if rank == 0:
            torch.save(result.final_state, workdir / f"trainer_{name}.pt")
        cases[name] = {"losses": [result.losses[s] for s in sorted(result.losses)],
                       "grad_norms": [result.grad_norms[s] for s in sorted(result.grad_norms)],
                       "saved": result.saved_step, "reference": key,
                       "verified": verify_checkpoint(workdir / f"ckpt_{name}" / "step_00000002") is None}
    mine = {}
    for key in sorted(references)[rank::world]:
        mine[key], weights = reference_training(*references[key], PARITY_STEPS)
        torch.save(weights, workdir / f"reference_{key}.pt")
    parts: list[Any] = [None] * world
    dist.all_gather_object(parts, mine)
    return {"capability": torch.backends.cpu.get_cpu_capability(), "cases": cases,
            "references": {key: value for part in parts for key, value in part.items()}}


def scenario_kill(workdir: Path, data_dir: Path) -> None:
    """Both kill cases, each in its own process that dies by SIGKILL (expected)."""
    for case in ("write", "prune"):
        try:
            mp.start_processes(_killed_mid_write, args=(str(workdir), str(data_dir), free_port(), case), nprocs=1,
                               start_method=RANK_START_METHOD)
        except mp.ProcessExitedException as error:
            (workdir / f"killed_{case}").write_text(str(error.signal_name))


def _worker(rank: int, world: int, port: int, scenario: str, workdir: str, data_dir: str, seed: int) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        if scenario == "core":
            result = scenario_core(Path(workdir), Path(data_dir))
        elif scenario == "resume":
            result = scenario_resume(Path(workdir), Path(data_dir), seed)
        elif scenario == "context_parallel":
            result = scenario_context_parallel(Path(workdir), Path(data_dir))
        elif scenario == "precisions_save":
            result = scenario_precisions_save(Path(workdir), Path(data_dir))
        elif scenario == "precisions_resume":
            result = scenario_precisions_resume(Path(workdir), Path(data_dir))
        elif scenario in ("parity", "parity_low_precision"):
            result = scenario_parity(Path(workdir), low_precision_only=scenario == "parity_low_precision")
        else:
            raise SystemExit(f"unknown scenario {scenario}")
        if rank == 0:
            (Path(workdir) / "result.json").write_text(json.dumps(result, indent=1))
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


if __name__ == "__main__":
    name, work, data = sys.argv[1], sys.argv[2], sys.argv[3]
    if name == "kill":
        scenario_kill(Path(work), Path(data))
        raise SystemExit(0)
    world_size = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    seed_value = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    mp.start_processes(_worker, args=(world_size, free_port(), name, work, data, seed_value), nprocs=world_size,
                       start_method=RANK_START_METHOD)
