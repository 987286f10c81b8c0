"""The `btk` planning commands on the fixture catalog: output, JSON shape, plots and one-line errors (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import fixture_catalog
import pytest
from cli_run import run

from btk.catalog import all_profiles, get_profile
from btk.cli.arguments import max_nodes

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fixture_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    fixture_catalog.install(monkeypatch)


def test_plan_json_matches_planner(capsys: pytest.CaptureFixture[str]) -> None:
    from btk.catalog import get_profile
    from btk.hardware import get_instance_type
    from btk.planner.search import plan_profile

    code, out, _ = run(capsys, "plan", "llama3.2-3b", "--format", "json")
    assert code == 0
    data = json.loads(out)
    expected = plan_profile(get_profile("llama3.2-3b"), get_instance_type("ml.p6-b200.48xlarge"), 1)
    assert data["knobs"] == expected.knobs.model_dump()
    assert data["speedup_vs_baseline"] > 1
    assert data["memory_gib"]["total"] <= data["memory_gib"]["capacity"]


def test_plan_text_shows_baseline_and_reasons(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "llama3.1-8b", "--instance", "ml.p5en.48xlarge", "--nodes", "2")
    assert code == 0
    assert "legacy baseline" in out and "speed-up over the legacy baseline" in out and "why:" in out


PNG = b"\x89PNG\r\n\x1a\n"


def test_plot_writes_png_and_says_where(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "plan.png"
    code, out, _ = run(capsys, "plan", "llama3.2-1b", "--plot", str(target))
    assert code == 0
    assert target.read_bytes()[:8] == PNG and target.stat().st_size > 10_000
    assert out.splitlines()[-1] == f"plot written to {target}"


def test_plot_path_goes_to_stderr_under_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "plan.png"
    code, out, err = run(capsys, "plan", "llama3.2-1b", "--plot", str(target), "--format", "json")
    assert code == 0 and json.loads(out)["profile"] == "llama3.2-1b"
    assert err == f"plot written to {target}\n"


def test_compare_plot_writes_png(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "compare.png"
    code, out, _ = run(capsys, "compare", "llama3.2-1b", "--instances", "p5,b200", "--plot", str(target))
    assert code == 0 and target.read_bytes()[:8] == PNG
    assert out.splitlines()[-1] == f"plot written to {target}"


def test_plot_labels_name_every_knob_that_differs() -> None:
    from btk.knobs import TrainingKnobs
    from btk.planner.plot import knob_labels

    full = TrainingKnobs(micro_batch_size=2, seq_len=8192, sharding="full_shard")
    labels = knob_labels([full, full.model_copy(update={"sharding": "no_shard"})])
    assert len(set(labels)) == 2 and "full_shard" in labels[0] and "no_shard" in labels[1]
    assert "mb" not in labels[0]  # the same in both: left out


def test_plan_json_carries_the_cost_of_total_tokens_and_the_global_batch(capsys: pytest.CaptureFixture[str]) -> None:
    from btk.catalog import get_profile

    code, out, _ = run(capsys, "plan", "llama3.1-8b", "--format", "json")
    assert code == 0
    data = json.loads(out)
    profile = get_profile("llama3.1-8b")
    assert data["global_batch_tokens"]["requested"] == profile.training.global_batch_tokens
    assert data["global_batch_tokens"]["planned"] == data["estimate"]["global_batch_tokens"]
    if profile.training.total_tokens is None:
        assert data["training_cost"] is None
        return
    cost = data["training_cost"]
    assert cost["total_tokens"] == profile.training.total_tokens
    assert cost["on_demand"]["days"] > 0 and cost["on_demand"]["usd"] > 0
    assert cost["training_plan"]["fee_usd"] is None


def test_estimate_applies_settings(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "estimate",
        "llama3.1-8b",
        "--instance",
        "ml.p5.48xlarge",
        "--set",
        "micro_batch_size=2",
        "--set",
        "activation_checkpointing=selective",
        "--set",
        "precision=fp8_tensorwise",
        "--format",
        "json",
    )
    assert code == 0
    data = json.loads(out)
    assert data["knobs"]["micro_batch_size"] == 2 and data["knobs"]["precision"] == "fp8_tensorwise"
    assert data["fits"] is True


def _estimate(capsys: pytest.CaptureFixture[str], *settings: str) -> dict[str, object]:
    argv = ["estimate", "llama3.1-8b", "--instance", "ml.p5.48xlarge", "--format", "json"]
    for setting in settings:
        argv += ["--set", setting]
    code, out, _ = run(capsys, *argv)
    assert code == 0
    data: dict[str, object] = json.loads(out)
    return data


def test_estimate_starts_from_the_plan_and_keeps_its_global_batch(capsys: pytest.CaptureFixture[str]) -> None:
    from btk.catalog import get_profile
    from btk.hardware import get_instance_type
    from btk.planner.search import plan_profile

    profile = get_profile("llama3.1-8b")
    plan = plan_profile(profile, get_instance_type("ml.p5.48xlarge"), 1)
    data = _estimate(capsys)
    assert data["start"] == "plan" and data["knobs"] == plan.knobs.model_dump()
    assert data["estimate"] == plan.evaluation.estimate.as_json()
    assert data["global_batch_tokens"] == plan.global_batch.as_json()


@pytest.mark.parametrize("setting", ["micro_batch_size=4", "seq_len=4096", "tensor_parallel=2"])
def test_estimate_recomputes_accumulation_to_keep_the_global_batch(
    capsys: pytest.CaptureFixture[str], setting: str
) -> None:
    from btk.catalog import get_profile

    target = get_profile("llama3.1-8b").training.global_batch_tokens
    data = _estimate(capsys, setting)
    knobs = data["knobs"]
    assert isinstance(knobs, dict)
    name, value = setting.split("=")
    assert knobs[name] == int(value)
    batch = data["global_batch_tokens"]
    assert isinstance(batch, dict) and batch["requested"] == target
    per_step = knobs["micro_batch_size"] * knobs["seq_len"] * 8 // knobs["tensor_parallel"]
    assert batch["planned"] == per_step * knobs["gradient_accumulation_steps"] >= target
    assert batch["planned"] - per_step < target  # the fewest micro-batches that reach it


def test_estimate_keeps_an_explicit_accumulation(capsys: pytest.CaptureFixture[str]) -> None:
    data = _estimate(capsys, "micro_batch_size=4", "gradient_accumulation_steps=3")
    knobs = data["knobs"]
    assert isinstance(knobs, dict) and knobs["gradient_accumulation_steps"] == 3
    batch = data["global_batch_tokens"]
    assert isinstance(batch, dict) and batch["planned"] == 4 * knobs["seq_len"] * 8 * 3


def test_estimate_text_says_where_it_started(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "estimate", "llama3.1-8b", "--instance", "p5", "--set", "micro_batch_size=4")
    assert code == 0
    assert "starting from the plan for this cluster; set: micro_batch_size" in out
    assert "recomputed to keep the profile's" in out


def test_estimate_help_says_it_starts_from_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "estimate", "--help")
    assert code == 0
    flat = " ".join(out.split())
    assert "start from the knobs `btk plan` chooses" in flat and "gradient_accumulation_steps is recomputed" in flat


def test_a_zero_part_of_the_memory_breakdown_says_why() -> None:
    import dataclasses

    from btk.catalog import get_profile
    from btk.hardware import get_instance_type
    from btk.planner.render import render_evaluation
    from btk.planner.search import plan_profile

    evaluation = plan_profile(get_profile("llama3.2-1b"), get_instance_type("p5"), 1).evaluation
    backward = dataclasses.replace(evaluation.memory, logits=0.0, other=0.0, peak_phase="backward")
    text = render_evaluation(dataclasses.replace(evaluation, memory=backward))
    assert "logits 0.0 (freed before the backward peak)" in text
    assert "other 0.0 (nothing gathered: unsharded)" in text


def test_estimate_warns_when_it_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "estimate", "qwen2.5-32b", "--instance", "p5", "--set", "micro_batch_size=8")
    assert code == 0 and "over the" in err


def test_compare_answers_the_migration_question(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "compare", "llama3.1-8b", "--instances", "ml.p5.48xlarge,ml.p6-b200.48xlarge", "--format", "json"
    )
    assert code == 0
    rows = {row["instance_type"]: row for row in json.loads(out)["instances"]}
    b200, h100 = rows["ml.p6-b200.48xlarge"], rows["ml.p5.48xlarge"]
    assert b200["tokens_per_second_per_gpu"] > h100["tokens_per_second_per_gpu"]
    longest_b200, longest_h100 = b200["longest_seq_len_one_node"], h100["longest_seq_len_one_node"]
    assert longest_b200 >= longest_h100 >= 8192
    # B200's larger HBM reaches a longer sequence, unless both reach the model's own context
    assert longest_b200 > longest_h100 or longest_h100 == get_profile("llama3.1-8b").architecture.max_context


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["plan", "llama3.1-8x"], "unknown profile 'llama3.1-8x'; did you mean llama3.1-8b"),
        (
            ["plan", "llama3.1-8b", "--instance", "ml.p9.48xlarge"],
            "instance type 'ml.p9.48xlarge' is not in the hardware catalog",
        ),
        (
            ["estimate", "llama3.1-8b", "--instance", "p5", "--set", "precision=mxfp8"],
            "precision mxfp8 is not supported on ml.p5.48xlarge",
        ),
        (
            ["estimate", "llama3.1-8b", "--set", "seq_len=262144"],
            "seq_len 262144 exceeds llama3.1-8b's max_context 131072",
        ),
        (
            ["estimate", "llama3.1-8b", "--set", "micro_batch_size"],
            "--set 'micro_batch_size' is malformed: use KEY=VALUE",
        ),
        (["estimate", "llama3.1-8b", "--set", "warp_speed=9"], "--set 'warp_speed': unknown knob"),
        (
            ["estimate", "llama3.1-8b", "--set", "fused_loss=-1", "--set", "fused_loss=true"],
            "--set fused_loss is given twice ('-1' and 'true'): give it once",
        ),
        (["estimate", "llama3.1-8b", "--set", "tensor_parallel=3"], "tensor_parallel: must be one of 1, 2, 4, 8"),
        (
            ["plan", "llama3.1-8b", "--nodes", "0"],
            f"argument --nodes: '0' is not a whole number from 1 to {max_nodes()}",
        ),
        (["plan"], "plan needs a PROFILE"),
        (["plan", "--env", "qa"], "unknown environment 'qa'"),
        (["compare", "llama3.1-8b", "--instances", ","], "--instances is empty"),
        (["plan", "llama3.1-8b", "--plot", "/tmp/x.jpg"], "must end in .png"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert needle in lines[0]
    assert "Traceback" not in err


def test_console_script_does_not_import_cdk_torch_boto3_or_sagemaker() -> None:
    profile = next(iter(all_profiles()))  # a subprocess: the user's catalog, not the fixtures
    code = (
        f"import sys; from btk.cli import main; main(['plan', {profile!r}, '--format', 'json']); "
        "heavy = [m for m in ('aws_cdk', 'torch', 'boto3', 'sagemaker', 'matplotlib') if m in sys.modules]; "
        "sys.stderr.write(repr(heavy))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert result.stderr == "[]"


def test_an_invalid_user_profile_is_one_line_naming_the_field(tmp_path: Path) -> None:
    """A profile whose heads do not divide its hidden size fails `btk` with one line, exit 2."""
    package = tmp_path / "profiles"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from btk.profile import ModelArchitecture, ModelProfile, TrainingIntent\n"
        "BAD = ModelProfile(name='bad-7b', family='test', training=TrainingIntent(seq_len=2048, "
        "global_batch_tokens=4096), architecture=ModelArchitecture(num_layers=2, hidden_size=1000, "
        "num_attention_heads=3, num_kv_heads=1, ffn_hidden_size=4000, vocab_size=32000, max_context=4096))\n"
        "PROFILES = (BAD,)\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "btk.cli", "profiles"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": f"{tmp_path}:{REPO}", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "profiles/__init__.py: profile 'bad-7b': architecture.num_attention_heads: " in result.stderr
    assert "num_attention_heads (3) must divide hidden_size (1000)" in result.stderr




def test_estimate_of_knobs_that_do_not_fit_prints_no_price_and_the_nearest_that_fit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["estimate", "qwen2.5-32b", "--instance", "p5", "--set", "micro_batch_size=8"]
    code, out, err = run(capsys, *argv, "--format", "json")
    assert code == 0 and "over the" in err
    data = json.loads(out)
    assert data["fits"] is False and data["estimate"] is None
    assert data["shortfall_gib"] == pytest.approx(data["memory_gib"]["total"] - 0.9 * data["memory_gib"]["capacity"],
                                                  abs=0.1)
    nearest = data["nearest_fitting"]
    assert nearest["fits"] is True and nearest["estimate"]["usd_per_billion_tokens"] > 0
    assert nearest["changed"] and all(" -> " in change for change in nearest["changed"])
    assert set(data["error_band"]) >= {"tokens_per_second_relative"}
    code, out, _ = run(capsys, *argv)
    assert code == 0
    assert out.count("per billion tokens") == 1 and "DOES NOT FIT" in out and "nearest knobs that fit" in out
    assert out.splitlines()[1].startswith("error band: ")


def test_compare_names_gpus_sorts_by_cost_and_takes_total_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "compare", "llama3.1-8b", "--total-tokens", "1.5T", "--format", "json")
    assert code == 0
    rows = [row for row in json.loads(out)["instances"] if row["fits"]]
    assert all(row["gpu"].startswith("NVIDIA ") for row in rows)
    ranked = [row for row in rows if row["cost_rank"] is not None]
    costs = [row["usd_per_billion_tokens"] for row in ranked]
    assert costs == sorted(costs) and len(ranked) >= 2
    assert all(row["training_cost"]["total_tokens"] == 1_500_000_000_000 for row in rows)
    code, out, _ = run(capsys, "compare", "llama3.1-8b", "--total-tokens", "1500000000000")
    assert code == 0 and "1.5T tokens on demand" in out and "GPU" in out.splitlines()[2]


@pytest.mark.parametrize("value", ["0", "1.5", "-3B", "1e9", "B", "3X", "1.00000000001K", "2000000P", "9" * 30])
def test_compare_refuses_a_bad_token_count_in_one_line(capsys: pytest.CaptureFixture[str], value: str) -> None:
    code, out, err = run(capsys, "compare", "llama3.1-8b", f"--total-tokens={value}")
    assert code == 2 and out == "" and err.count("\n") == 1 and "is not a token count" in err


@pytest.mark.parametrize("nodes", ["1", "64"])
def test_plan_estimate_and_compare_carry_the_band_of_their_question(
    capsys: pytest.CaptureFixture[str], nodes: str
) -> None:
    """The same question (profile, instance, nodes) gets the same band in plan, estimate and compare, in JSON and
    text; the band is null only where the text says the question is outside the published evidence."""
    from btk.catalog import get_profile
    from btk.hardware import get_instance_type
    from btk.planner.band import band_for

    profile, instance = get_profile("llama3.1-8b"), get_instance_type("ml.p5.48xlarge")
    expected = band_for(instance, profile.parameter_count, profile.training.seq_len, int(nodes))
    common = ["--nodes", nodes]
    documents = []
    for argv in (["plan", profile.name, "--instance", instance.name], ["estimate", profile.name, "--instance",
                                                                         instance.name]):
        code, out, _ = run(capsys, *argv, *common, "--format", "json")
        assert code == 0
        documents.append(json.loads(out)["error_band"])
    code, out, _ = run(capsys, "compare", profile.name, "--instances", instance.name, *common, "--format", "json")
    assert code == 0
    documents.append(json.loads(out)["instances"][0]["error_band"])
    assert all(document == expected.as_json() for document in documents)
    texts = []
    for argv in (["plan", profile.name, "--instance", instance.name], ["estimate", profile.name, "--instance",
                                                                         instance.name],
                 ["compare", profile.name, "--instances", instance.name]):
        code, out, _ = run(capsys, *argv, *common)
        assert code == 0
        texts.append(out)
    relative = expected.as_json()["tokens_per_second_relative"]
    for text in texts:
        assert expected.describe() in text
        if relative is None:
            assert "outside the published evidence" in text
        else:
            assert f"±{relative:.1%}" in text
    from btk.planner.band import BAND_FILE

    most_nodes = json.loads(BAND_FILE.read_text())["envelope"]["nodes"][1]
    assert (relative is None) == (int(nodes) > most_nodes)


def test_scaling_above_100_percent_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    """LLaMA 65B on 4 B200 nodes: the finer shards free memory for a larger micro-batch, which the line names,
    with what those knobs would need on one node; below 100 % no such claim is made."""
    code, out, _ = run(capsys, "plan", "llama-65b", "--nodes", "4", "--format", "json")
    assert code == 0
    scaling = json.loads(out)["scaling_vs_one_node"]
    assert scaling["efficiency"] > 1
    changed = scaling["knobs_changed"]
    assert changed and scaling["knobs_on_one_node"].startswith("needs ")
    code, text, _ = run(capsys, "plan", "llama-65b", "--nodes", "4")
    line = next(line for line in text.splitlines() if line.startswith("  above 100%:"))
    for name, (one, here) in changed.items():
        assert f"{name} {one} -> {here}" in line
    assert "one node cannot hold" in line and "costs less than on one node" in line
    code, text, _ = run(capsys, "plan", "llama3.1-8b", "--nodes", "2")
    assert "scaling: 9" in text and "above 100%" not in text


@pytest.mark.parametrize("argv", [["plan", "llama3.1-8b"], ["estimate", "llama3.1-8b", "--set", "precision=bf16"]])
def test_mfu_names_the_peak_it_is_a_share_of(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    """An fp8 plan's MFU is against the dense bf16 peak (torchtitan's convention), and the line says so."""
    code, out, _ = run(capsys, *argv)
    assert code == 0
    estimate = next(line for line in out.splitlines() if line.strip().startswith("estimate"))
    assert " of dense bf16 " in estimate.split("MFU", 1)[1]
    code, out, _ = run(capsys, "compare", "llama3.1-8b")
    assert "MFU: of the GPU's dense bf16 peak, whatever the row's precision" in out


@pytest.mark.parametrize("command", ["plan", "doctor"])
def test_an_environment_naming_a_profile_that_profiles_lacks_is_named_with_its_file(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    lost = fixture_catalog.DEV.model_copy(update={"name": "lost", "profiles": (fixture_catalog.LLAMA_1B.name, "gpt-x")})
    fixture_catalog.install(monkeypatch, lost)
    code, out, err = run(capsys, command, "--env", "lost")
    assert (code, out) == (2, "")
    assert err.startswith("btk: error: environments.py: environment 'lost': profiles: unknown profile 'gpt-x'"), err
    assert err.endswith(": add it to profiles/ or remove it from the environment\n") and err.count("\n") == 1, err


def test_profiles_says_which_counts_are_published(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A profile without a published count (an import with no checkpoint index) is listed as unverified."""
    profiles = list(all_profiles().values())
    unverified = profiles[0].model_copy(update={"name": "unverified-copy", "published_parameter_count": None})
    verified = profiles[0].model_copy(update={"name": "verified-copy",
                                              "published_parameter_count": profiles[0].parameter_count})
    monkeypatch.setattr("btk.catalog.all_profiles", lambda: {p.name: p for p in (unverified, verified)})
    code, out, _ = run(capsys, "profiles")
    assert code == 0 and out.splitlines()[0].split()[-1] == "count"
    rows = {line.split()[0]: line.split()[-1] for line in out.splitlines()[2:]}
    assert rows == {"unverified-copy": "unverified", "verified-copy": "published"}
    code, out, _ = run(capsys, "profiles", "--format", "json")
    assert {p["name"]: p["parameter_count_verified"] for p in json.loads(out)} == {"unverified-copy": False,
                                                                                    "verified-copy": True}


def test_btk_plan_runs_on_b300_and_gb200_by_alias(capsys: pytest.CaptureFixture[str]) -> None:
    for alias, gpu in (("b300", "NVIDIA B300"), ("gb200", "NVIDIA GB200")):
        code, out, err = run(capsys, "plan", "llama3.1-8b", "--instance", alias, "--nodes", "2")
        assert code == 0, err
        assert gpu in out and "outside the published evidence" in out


def test_btk_compare_covers_the_whole_catalog_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "compare", "llama3.1-8b", "--json")
    assert code == 0, err
    from btk.hardware import INSTANCE_TYPES

    assert {row["instance_type"] for row in json.loads(out)["instances"]} == set(INSTANCE_TYPES)


def test_plan_and_compare_take_a_sequence_length_and_keep_the_global_batch(capsys: pytest.CaptureFixture[str]) -> None:
    """`--set seq_len=N` plans the profile at N tokens (its global batch in tokens kept); a knob set is a pin."""
    profile = get_profile("llama3.1-8b")
    code, out, _ = run(capsys, "plan", "llama3.1-8b", "--set", "seq_len=131072", "--format", "json")
    assert code == 0
    plan = json.loads(out)
    assert plan["knobs"]["seq_len"] == 131072 and plan["memory_gib"]["total"] <= plan["memory_gib"]["capacity"]
    assert plan["global_batch_tokens"]["planned"] == profile.training.global_batch_tokens
    code, out, _ = run(capsys, "plan", "llama3.1-8b", "--set", "seq_len=32768", "--set", "context_parallel=2",
                       "--format", "json")
    assert code == 0 and json.loads(out)["knobs"]["context_parallel"] == 2
    instances = "ml.p5en.48xlarge,ml.p6-b200.48xlarge"
    code, out, _ = run(capsys, "compare", "llama3.1-8b", "--instances", instances, "--set", "seq_len=131072",
                       "--format", "json")
    assert code == 0
    rows = json.loads(out)["instances"]
    assert [row["instance_type"] for row in rows] and all(row["knobs"]["seq_len"] == 131072 for row in rows)


@pytest.mark.parametrize(
    ("command", "setting", "message"),
    [
        ("plan", "seq_len=262144", "seq_len 262144 exceeds llama3.1-8b's max_context 131072"),
        ("plan", "context_parallel=3", "context_parallel: must be one of 1, 2, 4, 8"),
        ("compare", "seq_len=x", "seq_len"),
        ("plan", "vocab_size=5", "--set 'vocab_size': unknown knob"),
    ],
)
def test_a_setting_plan_and_compare_cannot_use_is_one_line(capsys: pytest.CaptureFixture[str], command: str,
                                                           setting: str, message: str) -> None:
    code, out, err = run(capsys, command, "llama3.1-8b", "--set", setting, "--instances", "ml.p6-b200.48xlarge") \
        if command == "compare" else run(capsys, command, "llama3.1-8b", "--set", setting)
    assert code == 2 and message in err and err.count("\n") == 1 and not out, err
