"""The knobs applied to the model from outside: precision checks, float8/MXFP8 swaps, AC policy, compile."""

from __future__ import annotations

import shutil

import pytest
import torch
from btk_trainer.model import Decoder, OutputHead
from btk_trainer.parallelize import (
    apply_activation_checkpointing,
    apply_compile,
    apply_fused_loss,
    apply_low_precision,
    check_precision,
    selective_policy,
)
from torch.distributed.device_mesh import DeviceMesh
from trainer_fixtures import tiny_llama

from btk.errors import BtkError
from btk.profile import ModelArchitecture


def test_precision_checks() -> None:
    check_precision("bf16", None)
    check_precision("fp8_rowwise", (9, 0))
    check_precision("mxfp8", (10, 0))
    with pytest.raises(BtkError, match=r"mxfp8 needs a Blackwell GPU .* this GPU is 9.0"):
        check_precision("mxfp8", (9, 0))
    with pytest.raises(BtkError, match=r"needs compute capability >= 8.9.*8.0"):
        check_precision("fp8_tensorwise", (8, 0))
    with pytest.raises(BtkError, match="needs an NVIDIA GPU"):
        check_precision("fp8_tensorwise", None)


@pytest.mark.parametrize("precision", ["fp8_tensorwise", "fp8_rowwise"])
def test_float8_swaps_block_linears_not_the_head(llama_arch: ModelArchitecture, precision: str) -> None:
    pytest.importorskip("torchao")
    from torchao.float8.float8_linear import Float8Linear

    model = Decoder(llama_arch)
    assert apply_low_precision(model, precision, fsdp_float8_all_gather=False) == 7 * llama_arch.num_layers
    swapped = [name for name, module in model.named_modules() if isinstance(module, Float8Linear)]
    assert len(swapped) == 7 * llama_arch.num_layers
    assert "lm_head" not in " ".join(swapped) and type(model.lm_head) is OutputHead
    assert apply_low_precision(Decoder(llama_arch), "bf16", fsdp_float8_all_gather=False) == 0


def test_mxfp8_swaps_only_32_aligned_linears() -> None:
    """MXFP8 scales blocks of 32 elements: a 48-wide FFN stays bf16 under mxfp8, not under fp8."""
    pytest.importorskip("torchao")
    arch = ModelArchitecture(num_layers=1, hidden_size=64, num_attention_heads=4, num_kv_heads=2,
                             ffn_hidden_size=48, vocab_size=128, max_context=256)
    assert apply_low_precision(Decoder(arch), "fp8_tensorwise", fsdp_float8_all_gather=False) == 7
    assert apply_low_precision(Decoder(arch), "mxfp8", fsdp_float8_all_gather=False) == 4  # q, k, v, o


def test_selective_policy_recomputes_every_other_matmul() -> None:
    from torch.utils.checkpoint import CheckpointPolicy

    class Ctx:
        is_recompute = False

    policy = selective_policy()
    mm = torch.ops.aten.mm.default
    decisions = [policy(Ctx(), mm) for _ in range(4)]
    assert decisions == [CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE] * 2
    # float8 linears (_scaled_mm) count alike: fp8 + selective keeps the same share as bf16.
    fp8 = [policy(Ctx(), op) for op in (torch.ops.aten._scaled_mm.default, torch.ops.aten.mm.default) * 2]
    assert fp8 == [CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE] * 2
    assert policy(Ctx(), torch.ops.aten.add.Tensor) == CheckpointPolicy.PREFER_RECOMPUTE
    # torchtitan's save list: attention kernels, the float8 scales' maxima, the TP reduce-scatter.
    for op in (torch.ops.aten.max.default, torch.ops.aten._scaled_dot_product_cudnn_attention.default,
               torch.ops.aten._scaled_dot_product_flash_attention.default,
               torch.ops._c10d_functional.reduce_scatter_tensor.default):
        assert policy(Ctx(), op) == CheckpointPolicy.MUST_SAVE, op


def test_selective_checkpointing_does_not_recompute_float8_scales(llama_arch: ModelArchitecture) -> None:
    """Backward under selective AC takes as many float8 maxima (aten.max) as without checkpointing: the forward's
    scales are saved, not recomputed (full AC recomputes them all)."""
    pytest.importorskip("torchao")
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountMaxima(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func: object, types: object, args: tuple[object, ...] = (),
                               kwargs: dict[str, object] | None = None) -> object:
            if func is torch.ops.aten.max.default:
                CountMaxima.calls += 1
            return func(*args, **(kwargs or {}))  # type: ignore[operator]  # an OpOverload

    def backward_maxima(mode: str) -> int:
        model = Decoder(llama_arch)
        model.init_weights(seed=0)
        apply_low_precision(model, "fp8_tensorwise", fsdp_float8_all_gather=False)
        apply_activation_checkpointing(model, mode)
        tokens = torch.randint(0, llama_arch.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
        loss = model(tokens, tokens)
        CountMaxima.calls = 0
        with CountMaxima():
            loss.backward()
        return CountMaxima.calls

    plain, selective, full = (backward_maxima(mode) for mode in ("none", "selective", "full"))
    assert plain > 0
    assert selective == plain
    assert full > plain


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("c++") is None, reason="Inductor on CPU needs a C++ compiler")
def test_inductor_compiles_selective_ac_blocks_and_fused_loss() -> None:
    """The GPU's compile path through Inductor (C++ here, Triton there): same loss and gradients as eager.

    Inductor's min-cut partitioner honours the selective-AC policy's save/recompute tags; the
    aot_eager checks in the gloo tests do not reach it.
    """
    eager, compiled = Decoder(tiny_llama()), Decoder(tiny_llama())
    eager.init_weights(seed=1)
    compiled.load_state_dict(eager.state_dict())
    apply_activation_checkpointing(compiled, "selective")
    apply_compile(compiled)
    apply_fused_loss(compiled)
    tokens = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(0))
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    try:
        compiled_loss = compiled(tokens, tokens)
        compiled_loss.backward()
        graphs = counters["stats"]["unique_graphs"]
    finally:
        torch._dynamo.reset()
    assert graphs >= 2  # a block (shared by both) and the loss really went through the compiler
    eager_loss = eager(tokens, tokens)
    eager_loss.backward()
    assert abs(compiled_loss.item() - eager_loss.item()) <= 1e-6
    reference = {name: parameter.grad for name, parameter in eager.named_parameters()}
    for name, parameter in compiled.named_parameters():
        plain = name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")
        assert parameter.grad is not None and torch.allclose(parameter.grad, reference[plain], atol=1e-6), name


def test_mxfp8_keeps_the_bias_and_plain_weights(qwen_arch: ModelArchitecture) -> None:
    """Qwen's q/k/v bias survives the MXFP8 swap: in the output and in the gradient; weights stay plain tensors."""
    pytest.importorskip("torchao")
    from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear

    model = Decoder(qwen_arch)
    model.init_weights(seed=2)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    assert apply_low_precision(model, "mxfp8", fsdp_float8_all_gather=False, emulate_mxfp8=True) == 14
    q_proj = model.model.layers[0].self_attn.q_proj
    assert isinstance(q_proj, MXFP8Linear) and q_proj.bias is not None
    assert all(torch.equal(value, before[name]) for name, value in model.state_dict().items())  # values kept
    with torch.no_grad():
        q_proj.bias.fill_(5.0)
    hidden = torch.randn(2, 32, qwen_arch.hidden_size)
    out = q_proj(hidden)
    assert abs(float(out.detach().mean()) - 5.0) < 0.1
    out.sum().backward()
    assert q_proj.bias.grad is not None and torch.equal(q_proj.bias.grad, torch.full_like(q_proj.bias, 64.0))
    assert all(type(value) is torch.Tensor for value in model.state_dict().values())
    assert "model.layers.0.self_attn.q_proj.bias" in model.state_dict()  # Hugging Face names unchanged


def test_rowwise_float8_makes_inductor_emulate_precision_casts(llama_arch: ModelArchitecture) -> None:
    pytest.importorskip("torchao")
    import torch._inductor.config as inductor_config

    # torch's own patch, not pytest's monkeypatch: undoing a monkeypatch deletes the config entry, and every
    # later compile in this process then fails on the missing option.
    before = inductor_config.emulate_precision_casts
    with inductor_config.patch(emulate_precision_casts=False):
        apply_low_precision(Decoder(llama_arch), "fp8_tensorwise", fsdp_float8_all_gather=False)
        assert inductor_config.emulate_precision_casts is False
        apply_low_precision(Decoder(llama_arch), "fp8_rowwise", fsdp_float8_all_gather=False)
        assert inductor_config.emulate_precision_casts is True
    assert inductor_config.emulate_precision_casts is before


@pytest.mark.parametrize(("device_type", "compiled", "requested"),
                         [("cpu", True, True), ("cuda", False, True), ("cuda", True, False)])
def test_async_tensor_parallel_only_when_asked_on_compiled_cuda(device_type: str, compiled: bool,
                                                                 requested: bool) -> None:
    """Async TP is an Inductor pass over NCCL collectives, and a job runs it only when it asks for it
    (``job.async_tensor_parallel``, off by default): otherwise nothing is set, on compiled CUDA too."""
    import types

    import torch._inductor.config
    from btk_trainer.parallelize import enable_async_tensor_parallel

    mesh = types.SimpleNamespace(device_type=device_type, size=lambda: 2)  # no process group: nothing may use one
    with torch._inductor.config.patch(_micro_pipeline_tp=False):
        assert enable_async_tensor_parallel(mesh, compiled=compiled,  # type: ignore[arg-type]
                                            requested=requested) is False
        assert torch._inductor.config._micro_pipeline_tp is False


def test_async_tensor_parallel_applies_only_where_asked_and_offered() -> None:
    from btk_trainer.parallelize import async_tensor_parallel_applies

    where = {(requested, compiled, device, tp): async_tensor_parallel_applies(requested, compiled=compiled,
                                                                             device_type=device, tp=tp)
             for requested in (False, True) for compiled in (False, True) for device in ("cpu", "cuda")
             for tp in (1, 2, 8)}
    assert {key for key, applies in where.items() if applies} == {(True, True, "cuda", 2), (True, True, "cuda", 8)}


def test_the_trainer_hands_the_jobs_async_tensor_parallel_setting_to_parallelize(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``build_model`` (here through the dry run: the trainer's own code on fake tensors, TP=2) asks for async
    TP exactly when the job does: never by default."""
    from btk_trainer import dryrun, parallelize
    from trainer_fixtures import tiny_qwen

    from btk.hardware import get_instance_type
    from btk.knobs import TrainingKnobs
    from btk.profile import TrainingIntent

    asked: list[bool] = []
    original = parallelize.enable_async_tensor_parallel

    def record(tp_mesh: DeviceMesh, *, compiled: bool, requested: bool = False) -> bool:
        asked.append(requested)
        return original(tp_mesh, compiled=compiled, requested=requested)

    monkeypatch.setattr(parallelize, "enable_async_tensor_parallel", record)
    case = dryrun.DryRunCase(name="toy", architecture=tiny_qwen(), instance=get_instance_type("ml.p6-b200.48xlarge"),
                             nodes=1, training=TrainingIntent(seq_len=128, global_batch_tokens=1 << 14),
                             knobs=TrainingKnobs(micro_batch_size=1, seq_len=128, tensor_parallel=2))
    spec = case.spec()
    for wanted in (False, True):
        job = spec.job.model_copy(update={"async_tensor_parallel": wanted})
        monkeypatch.setattr(dryrun.DryRunCase, "spec", lambda self, job=job: spec.model_copy(update={"job": job}))
        dryrun.run_steps(case)
    assert asked == [False, True] and spec.job.async_tensor_parallel is False


def test_tensor_parallel_must_divide_vocabulary_and_sequence() -> None:
    from btk_trainer.parallelize import _check_tensor_parallel_divides

    _check_tensor_parallel_divides(tiny_llama(), 32, 2)
    with pytest.raises(BtkError, match="must divide seq_len"):
        _check_tensor_parallel_divides(tiny_llama(), 33, 2)


@pytest.mark.usefixtures("one_rank")
def test_every_block_is_resharded_after_forward_and_the_head_is_not(llama_arch: ModelArchitecture) -> None:
    """torchtitan's FSDP groups: after forward (the loss included) no block holds its gathered weights, the last one
    too; the final norm + head group stays gathered for the start of backward."""
    import torch.distributed as dist
    from btk_trainer.parallelize import apply_fsdp, build_mesh, mesh_shape

    from btk.knobs import TrainingKnobs

    dist.init_process_group("gloo")
    model = Decoder(llama_arch)
    model.init_weights(seed=0)
    shape = mesh_shape(1, 1, TrainingKnobs(micro_batch_size=1, seq_len=32))
    apply_fsdp(model, build_mesh(shape, "cpu"), shape, None)
    tokens = torch.randint(0, llama_arch.vocab_size, (1, 32), generator=torch.Generator().manual_seed(0))
    model(tokens, tokens)

    def gathered(module: torch.nn.Module) -> bool:
        group = module._get_fsdp_state()._fsdp_param_group  # type: ignore[operator]  # FSDP2 adds it
        return bool(group.is_unsharded)

    assert [gathered(layer) for layer in model.model.layers] == [False] * llama_arch.num_layers
    assert gathered(model.lm_head)
