"""The dry run (``btk_trainer.dryrun``): the trainer's own code at full size on fake tensors, beside the planner.

Toy models check the memory tracker: on fake tensors it counts what it counts with real ones,
with real tensors it counts what the CPU allocator allocates, and the static parts are the
exact count of FSDP2's shards. Bad input is one line (exit 2); a plan the trainer cannot build
and a plan that does not fit fail in one line (exit 1). Full-size cases (``slow``, two at a
time): every plan of the user's ``environments.py`` at its instance type, node count and knobs
and one legacy baseline (as ``--shipped``), a tensor-parallel plan over 2 nodes and an MXFP8
plan on the fixture catalog, the plans of Granite 3.3 8B, SmolLM3-3B and Phi-4 imported from
their real config.json files, and each family's plan at 131,072 tokens on B200 and on B300 (Llama 3.1 8B,
Qwen2.5 32B with YaRN).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import fixture_catalog
import pytest
import torch
from btk_trainer import dryrun
from btk_trainer.layout import mesh_shape
from btk_trainer.model import Decoder
from trainer_fixtures import tiny_llama, tiny_olmo2, tiny_qwen, tiny_qwen3

from btk import catalog
from btk.cli.arguments import max_nodes
from btk.hardware import get_instance_type
from btk.hf_import import profile_from_config
from btk.knobs import TrainingKnobs
from btk.planner.search import memory_budget_gib
from btk.profile import ModelArchitecture, ModelProfile, TrainingIntent

B200 = get_instance_type("ml.p6-b200.48xlarge")
TOY_KNOBS = {"micro_batch_size": 2, "seq_len": 256, "gradient_accumulation_steps": 2}


def toy_case(arch: ModelArchitecture, nodes: int = 1, documents: bool = False, **knobs: Any) -> dryrun.DryRunCase:
    values = {**TOY_KNOBS, **knobs}
    return dryrun.DryRunCase(name="toy", architecture=arch, training=TrainingIntent(
        seq_len=256, global_batch_tokens=1 << 14, document_masking=documents), instance=B200, nodes=nodes,
        knobs=TrainingKnobs.model_validate(values))


TRACKED = {
    "bf16": toy_case(tiny_llama()),
    "selective": toy_case(tiny_llama(), activation_checkpointing="selective"),
    "full": toy_case(tiny_qwen(), activation_checkpointing="full"),
    "fp8-all-gather": toy_case(tiny_llama(), precision="fp8_tensorwise", activation_checkpointing="selective"),
    "mxfp8": toy_case(tiny_llama(), precision="mxfp8"),
    "hybrid-2-nodes": toy_case(tiny_llama(), nodes=2, sharding="hybrid_shard"),
    "tp2": toy_case(tiny_qwen(), tensor_parallel=2, activation_checkpointing="selective"),
    "tp2-fp8": toy_case(tiny_llama(), tensor_parallel=2, precision="fp8_tensorwise"),
    "qwen3-tp2": toy_case(tiny_qwen3(), tensor_parallel=2),
    "olmo2-tp2": toy_case(tiny_olmo2(), tensor_parallel=2, activation_checkpointing="selective"),
    "documents": toy_case(tiny_llama(), documents=True, activation_checkpointing="selective"),
    "documents-cp2": toy_case(tiny_llama(), documents=True, context_parallel=2, micro_batch_size=1),
}


@pytest.mark.parametrize("name", list(TRACKED))
def test_fake_tensors_count_what_real_tensors_count(name: str) -> None:
    """Every category of the peak on fake tensors equals the same run's with real tensors on the CPU.

    Under float8 tensor parallelism the float8 copy of a column-parallel block's gathered input (the
    micro-batch's full sequence, hidden wide, one byte an element; two blocks a layer: attention and MLP)
    is freed at a point of the step that varies from run to run, with real tensors as with fake ones.
    Over some fifty runs of the two-layer toy the peak's activations spanned four such copies (five
    values); there the figures agree within one copy per block.
    """
    case = TRACKED[name]
    fake, real = dryrun.run_steps(case), dryrun.run_steps(case, fake=False)
    knobs, arch = case.knobs, case.architecture
    float8_copy = knobs.micro_batch_size * knobs.seq_len * arch.hidden_size / dryrun.GIB
    slack = 2 * arch.num_layers * float8_copy if name == "tp2-fp8" else 0.0
    for category in (*dryrun.CATEGORIES, "total"):
        assert abs(getattr(fake, category) - getattr(real, category)) <= slack + 1e-12, category
    assert real.activations > 0 and real.optimizer > 0


@pytest.mark.parametrize(("masked", "knobs"), [
    ("documents", {"activation_checkpointing": "selective"}),
    ("documents-cp2", {"context_parallel": 2, "micro_batch_size": 1}),
])
def test_a_document_masked_step_less_the_cpus_dense_mask_is_the_causal_steps_memory(
        masked: str, knobs: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """What a GPU holds for a document-masked step (its block mask is kilobytes) is the causal step's memory: the
    dry run's count less the CPU's dense mask equals it in every category; counted whole, the mask is there."""
    case = TRACKED[masked]
    causal = dryrun.run_steps(toy_case(tiny_llama(), **knobs))
    measured = dryrun.run_steps(case)
    for category in (*dryrun.CATEGORIES, "total"):
        assert getattr(measured, category) == pytest.approx(getattr(causal, category), abs=1e-12), category
    mask = dryrun.dense_mask_gib(case.knobs, documents=True)
    expected = case.knobs.micro_batch_size * case.knobs.seq_len // case.knobs.context_parallel * case.knobs.seq_len
    assert mask * dryrun.GIB == expected * 2  # bf16, one per sequence
    monkeypatch.setattr(dryrun, "dense_mask_gib", lambda knobs, documents=False, arch=None: 0.0)
    assert dryrun.run_steps(case).total == pytest.approx(causal.total + mask, abs=1e-12)


WIDER = {"hidden_size": 256, "num_attention_heads": 8, "ffn_hidden_size": 1024, "vocab_size": 4096, "max_context": 512}


@pytest.mark.parametrize("name", ["selective", "fp8-all-gather", "tp2"])
def test_tracker_counts_what_the_cpu_allocator_allocates(name: str) -> None:
    """With real tensors the tracker's peak is the CPU allocator's, to the kilobyte (float8 matmuls counted by
    their output: the CPU emulates them in wider types inside the call, a GPU does not).

    The toys are 4 times wider and their sequences twice as long here: at the peak of the narrower toys the
    allocator also holds some 50 KiB the tracker never sees (under activation checkpointing, in a matmul's
    backward), a fixed amount that is gone at this size (32 bytes apart).
    """
    toy = TRACKED[name]
    knobs = toy.knobs.model_copy(update={"seq_len": 512}).model_dump()
    allocator, tracked = dryrun.cpu_allocator_peak(toy_case(toy.architecture.model_copy(update=WIDER), toy.nodes,
                                                            **knobs))
    assert abs(tracked.total - allocator) * dryrun.GIB <= 1024


def test_static_memory_is_the_exact_count_of_the_shards() -> None:
    """fp32 master shards, fp32 gradient shards and two fp32 AdamW moments (and a step count per parameter) of rank
    0: each parameter's first dimension padded to a multiple of the 8 ranks, then split."""
    case = TRACKED["bf16"]
    with torch.device("meta"):
        model = Decoder(case.architecture)
    shard = sum(math.ceil(p.shape[0] / 8) * p[0].numel() for p in model.parameters())
    count = len(list(model.parameters()))
    measured = dryrun.run_steps(case)
    gib = dryrun.GIB
    assert measured.parameters * gib == 4 * shard
    assert measured.gradients * gib == 4 * shard
    assert measured.optimizer * gib == 8 * shard + 4 * count


def test_tensor_parallel_that_does_not_divide_the_kv_heads_fails_in_one_line() -> None:
    result = dryrun.dry_run(toy_case(tiny_llama(), tensor_parallel=4))  # 2 KV heads
    assert result.measured is None
    assert result.problems(0.1) == [
        "the trainer raised: tensor_parallel=4 must divide num_kv_heads (2); lower tensor_parallel"]


def test_a_shape_error_of_the_real_code_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the model's code raises (here a projection one column short) is the case's one-line error."""
    original = Decoder.__init__

    def broken(self: Decoder, arch: ModelArchitecture) -> None:
        original(self, arch)
        for layer in self.model.layers:
            layer.self_attn.o_proj = torch.nn.Linear(arch.attention_width - 1, arch.hidden_size, bias=False)

    monkeypatch.setattr(Decoder, "__init__", broken)
    result = dryrun.dry_run(toy_case(tiny_llama()))
    assert result.error is not None and result.error.startswith("RuntimeError: ")
    assert "\n" not in result.error and len(result.problems(0.1)) == 1


TOY_PROFILE = ModelProfile(name="toy-gqa", family="llama", architecture=tiny_llama(),
                           training=TrainingIntent(seq_len=128, global_batch_tokens=1 << 15))


@pytest.fixture
def toy_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    fixture_catalog.install(monkeypatch)
    monkeypatch.setattr(catalog, "all_profiles", lambda: {**fixture_catalog.PROFILES, TOY_PROFILE.name: TOY_PROFILE})


def test_cli_reports_a_broken_plan_and_exits_1(toy_catalog: None, capsys: pytest.CaptureFixture[str]) -> None:
    code = dryrun.main(["--profile", "toy-gqa", "--instance-type", B200.name, "--set", "tensor_parallel=4",
                        "--set", "precision=bf16"])
    out = capsys.readouterr().out
    assert code == 1
    [row] = [line for line in out.splitlines() if line.startswith("toy-gqa")]
    assert row.endswith("the trainer raised: tensor_parallel=4 must divide num_kv_heads (2); lower tensor_parallel")


def test_cli_passes_a_plan_that_fits(toy_catalog: None, capsys: pytest.CaptureFixture[str]) -> None:
    code = dryrun.main(["--profile", "toy-gqa", "--instance-type", B200.name, "--format", "json",
                        "--tolerance", "0.99"])
    [result] = json.loads(capsys.readouterr().out)
    assert code == 0 and result["problems"] == [] and result["error"] is None
    assert result["dry_run_gib"]["total"] > 0 and result["executed_knobs"]["compile"] is False


def test_cli_runs_every_profile_of_an_environment(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """``--env`` alone: each of its profiles on its instance type and node count; ``--baseline``: their legacy
    baselines (full checkpointing, micro-batch 1, bf16)."""
    toy = fixture_catalog.DEV.model_copy(update={"name": "toy", "profiles": (TOY_PROFILE.name, TOY_PROFILE.name)})
    fixture_catalog.install(monkeypatch, toy)
    monkeypatch.setattr(catalog, "all_profiles", lambda: {**fixture_catalog.PROFILES, TOY_PROFILE.name: TOY_PROFILE})
    code = dryrun.main(["--env", "toy", "--baseline", "--format", "json", "--tolerance", "0.99"])
    results = json.loads(capsys.readouterr().out)
    assert code == 0 and [result["profile"] for result in results] == [TOY_PROFILE.name] * 2
    for result in results:
        assert result["label"] == "baseline" and result["nodes"] == toy.instance_count
        assert result["knobs"]["activation_checkpointing"] == "full" and result["knobs"]["micro_batch_size"] == 1


@pytest.mark.parametrize("argv, message", [
    (["--profile", "no-such-profile", "--env", "dev"], "no-such-profile"),
    (["--profile", "toy-gqa"], "name the cluster: --env ENV, or --instance-type TYPE"),
    ([], "name a --profile, an --env, or --shipped"),
    (["--profile", "toy-gqa", "--env", "dev", "--instance-type", B200.name], "give --env or --instance-type"),
    (["--profile", "toy-gqa", "--instance-type", B200.name, "--nodes", "0"], "--nodes 0: a whole number from 1 to"),
    # btk plan's bound (a job's instance count): a larger world would run for as long as the user waits
    (["--profile", "toy-gqa", "--instance-type", B200.name, "--nodes", str(max_nodes() + 1)],
     f"--nodes {max_nodes() + 1}: a whole number from 1 to {max_nodes()}"),
    (["--env", "dev", "--nodes", "100000"], "--nodes 100000: a whole number from 1 to"),
    (["--profile", "toy-gqa", "--instance-type", B200.name, "--set", "micro_batch_size"], "--set 'micro_batch_size'"),
    (["--profile", "toy-gqa", "--instance-type", B200.name, "--set", "tensor_parallel=3"], "tensor_parallel"),
    (["--profile", "toy-gqa", "--instance-type", "ml.nope"], "ml.nope"),
    (["--shipped", "--env", "dev"], "--shipped takes no"),
    (["--profile", "toy-gqa", "--instance-type", B200.name, "--tolerance", "0"], "--tolerance"),
    (["--shipped", "--jobs", "0"], "--jobs 0: a whole number from 1 to"),
    (["--shipped", "--jobs", "2", "--traceback"], "drop --jobs"),
])
def test_bad_input_is_one_line_and_exit_2(toy_catalog: None, capsys: pytest.CaptureFixture[str],
                                           argv: list[str], message: str) -> None:
    code = dryrun.main(argv)
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    [line] = captured.err.splitlines()
    assert line.startswith("btk_trainer.dryrun: ") and message in line


def shipped_label(case: dryrun.DryRunCase) -> str:
    return f"shipped:{case.name}@{case.instance.name}x{case.nodes}" + ("-baseline" if case.label == "baseline" else "")


SHIPPED = {shipped_label(case): case for case in dryrun.shipped_cases()}
"""Every plan of the user's environments.py (and one legacy baseline), as ``--shipped`` runs them."""


def fixture_case(name: str, nodes: int, **settings: str) -> dryrun.DryRunCase:
    return dryrun.profile_case(fixture_catalog.PROFILES[name], B200, nodes, settings or None)


def long_context_case(profile: ModelProfile, instance_type: str, seq_len: int) -> dryrun.DryRunCase:
    """The plan of a fixture profile at a long sequence (``btk plan --set seq_len=N``) on one node, attending
    within documents as long-context recipes do (``train.document_masking``)."""
    masked = profile.model_copy(update={"training": profile.training.model_copy(update={"document_masking": True})})
    return dryrun.profile_case(masked, get_instance_type(instance_type), 1, {"seq_len": str(seq_len)})


def imported_case(config_file: str, name: str) -> dryrun.DryRunCase:
    """The plan of a profile imported from a real config.json (tests/hf_configs) on one B200 node."""
    config = json.loads((Path(__file__).resolve().parents[1] / "hf_configs" / config_file).read_text())
    return dryrun.profile_case(profile_from_config(config, name), B200, 1, None)


FULL_SIZE = {
    "tensor-parallel": lambda: fixture_case("llama3.2-1b", 2, tensor_parallel="2",
                                            activation_checkpointing="selective"),
    "mxfp8": lambda: fixture_case("llama3.2-1b", 1, precision="mxfp8", activation_checkpointing="selective"),
    # The families whose block adds to Llama's: multipliers, blocks without RoPE, fused checkpoint projections.
    "granite": lambda: imported_case("granite-3.3-8b-instruct.json", "granite-3.3-8b"),
    "smollm3": lambda: imported_case("smollm3-3b.json", "smollm3-3b"),
    "phi3": lambda: imported_case("phi-4.json", "phi-4"),
    # Gemma's block: four norms, windowed blocks (their dense CPU mask left out), soft caps (Gemma 2).
    "gemma2": lambda: imported_case("gemma-2-9b-it.json", "gemma-2-9b"),
    "gemma3": lambda: imported_case("gemma-3-1b-it.json", "gemma-3-1b"),
    # Long contexts, each family at 131,072 tokens on B200 and B300 (context parallelism): Llama 3.1 8B, and
    # Qwen2.5 32B with YaRN. A plan the trainer sees alike on both (Qwen's) runs once, held to each budget.
    **{f"long-context-{family}-{gpu}": (lambda profile=profile, gpu=gpu: long_context_case(
        profile, f"ml.p6-{gpu}.48xlarge", 131072))
       for family, profile in (("llama", fixture_catalog.LLAMA_8B), ("qwen", fixture_catalog.QWEN_32B_YARN))
       for gpu in ("b200", "b300")},
}
DRY_RUN_JOBS = 2
"""Cases run side by side: one core each (CI has two)."""


@pytest.fixture(scope="module")
def full_size() -> dict[str, dryrun.DryRunResult]:
    """Each full-size case run once for the tests below: every shipped plan, and the fixture catalog's cases."""
    cases = {**SHIPPED, **{label: make() for label, make in FULL_SIZE.items()}}
    return dict(zip(cases, dryrun.dry_run_all(list(cases.values()), jobs=DRY_RUN_JOBS), strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("label", [*SHIPPED, *FULL_SIZE])
def test_full_size_plan_builds_trains_and_fits(full_size: dict[str, dryrun.DryRunResult], label: str) -> None:
    """The real model at its real size over the job's real world size: every parameter is there (rank 0's fp32
    shards times the ranks that hold different ones, less FSDP's padding), a steady-state step trains, and the
    plan's projected peak fits."""
    result = full_size[label]
    case = result.case
    assert result.error is None and result.measured is not None
    shape = mesh_shape(case.world_size, case.nodes, case.knobs)
    shards = result.measured.parameters * dryrun.GIB / 4 * shape.dp_shard * shape.cp * shape.tp
    assert case.architecture.parameter_count <= shards <= case.architecture.parameter_count * 1.001
    assert result.projected_gib is not None
    if result.memory_compared:  # an emulated precision's peak holds the emulation's temporaries
        assert result.projected_gib <= memory_budget_gib(case.instance)


@pytest.mark.slow
@pytest.mark.parametrize("label", [*SHIPPED, *FULL_SIZE])
def test_full_size_plan_passes_the_dry_run(full_size: dict[str, dryrun.DryRunResult], label: str) -> None:
    """Within the tolerance of the planner; MXFP8, emulated on the CPU, is built and trained but not compared."""
    result = full_size[label]
    assert result.problems(dryrun.DEFAULT_TOLERANCE) == []
    assert result.memory_compared == (result.case.knobs.precision != "mxfp8")
    if result.memory_compared:
        assert result.difference is not None and abs(result.difference) <= dryrun.DEFAULT_TOLERANCE
    else:
        assert "memory not compared" in dryrun.result_table(dryrun.DEFAULT_TOLERANCE).text([result])[-1]


def test_cases_the_trainer_sees_alike_run_once_each_held_to_its_own_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same toy plan on B200 and B300 (same GPUs per node, both allow its precision) runs once; on H200,
    where MXFP8 is refused, it runs again, and fails there."""
    ran: list[str] = []
    real = dryrun.run_steps

    def counted(case: dryrun.DryRunCase, *, fake: bool = True) -> Any:
        ran.append(case.instance.name)
        return real(case, fake=fake)

    monkeypatch.setattr(dryrun, "run_steps", counted)
    mxfp8 = toy_case(tiny_llama(), precision="mxfp8")
    on = {name: dryrun.DryRunCase(**{**mxfp8.__dict__, "instance": get_instance_type(name)})
          for name in ("ml.p6-b200.48xlarge", "ml.p6-b300.48xlarge", "ml.p5en.48xlarge")}
    b200, b300, h200 = dryrun.dry_run_all(list(on.values()))
    assert ran == ["ml.p6-b200.48xlarge", "ml.p5en.48xlarge"]
    assert b300.case is on["ml.p6-b300.48xlarge"] and b300.measured == b200.measured and b300.error is None
    assert (b200.budget_gib, b300.budget_gib) == (memory_budget_gib(b200.case.instance),
                                                  memory_budget_gib(b300.case.instance))
    assert b300.budget_gib > b200.budget_gib
    assert h200.measured is None and h200.error is not None and "mxfp8" in h200.error


@pytest.mark.slow
def test_a_micro_batch_that_overflows_fails_in_one_line(capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    fixture_catalog.install(monkeypatch)
    code = dryrun.main(["--profile", "llama3.2-1b", "--instance-type", B200.name, "--set", "micro_batch_size=32",
                        "--tolerance", "0.99", "--format", "json"])
    [result] = json.loads(capsys.readouterr().out)
    assert code == 1 and result["error"] is None
    [problem] = result["problems"]
    assert problem.startswith("projected peak ") and problem.endswith(f"budget of {B200.name}")
    assert result["projected_gib"] > result["budget_gib"]
