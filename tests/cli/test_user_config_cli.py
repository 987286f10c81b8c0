"""`btk` on the user's own ``profiles/`` and ``environments.py``, and the README's examples of them."""

from __future__ import annotations

import json
from pathlib import Path

import fixture_catalog
import pytest
from cli_run import run

from btk.catalog import all_environments

REPO = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"


def test_profiles_table_lists_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    from btk.catalog import all_profiles

    code, out, _ = run(capsys, "profiles")
    assert code == 0
    for name in all_profiles():
        assert name in out


@pytest.mark.parametrize("env", sorted(all_environments()))
def test_plan_env_plans_every_profile(capsys: pytest.CaptureFixture[str], env: str) -> None:
    code, out, _ = run(capsys, "plan", "--env", env, "--format", "json")
    assert code == 0
    plans = json.loads(out)
    assert [p["profile"] for p in plans] == list(all_environments()[env].profiles)
    config = all_environments()[env]
    for plan in plans:  # the rehearsal where the environment rehearses, with the gate the pipeline will hold
        rehearsal = plan["rehearsal"]
        assert (rehearsal is not None) == config.rehearses
        if rehearsal is not None:
            expected = rehearsal["predicted_tokens_per_second_per_gpu"] * config.rehearsal.min_throughput_share
            assert rehearsal["steps"] == config.rehearsal.steps
            assert abs(rehearsal["min_tokens_per_second_per_gpu"] - expected) <= 0.1  # the JSON rounds both


def test_plan_env_plot_draws_every_profile(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    env = max(all_environments().values(), key=lambda e: len(e.profiles))
    code, out, _ = run(capsys, "plan", "--env", env.name, "--plot", str(tmp_path / "env.png"))
    assert code == 0
    expected = (
        [tmp_path / f"env-{name}.png" for name in env.profiles] if len(env.profiles) > 1 else [tmp_path / "env.png"]
    )
    for path in expected:
        assert path.read_bytes()[:8] == PNG
        assert f"plot written to {path}" in out.splitlines()


def test_plan_profile_on_an_environment_uses_its_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    from btk.hardware import get_instance_type

    env = next(iter(all_environments().values()))
    profile = env.profiles[0]
    code, out, _ = run(capsys, "plan", profile, "--env", env.name, "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert data["profile"] == profile and data["nodes"] == env.instance_count
    assert data["instance_type"] == get_instance_type(env.instance_type).name


def test_readme_sample_plan_is_current(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's `btk plan llama3.1-8b` excerpt is what the command prints today for the shipped
    catalog (the fixture catalog mirrors it), whatever the user's profiles/ and environments.py hold."""
    fixture_catalog.install(monkeypatch)
    readme = (REPO / "README.md").read_text()
    start = readme.index("`btk plan llama3.1-8b` (abridged):")
    block = readme[readme.index("```\n", start) + 4 : readme.index("\n```", readme.index("```\n", start) + 4)]
    code, out, _ = run(capsys, "plan", "llama3.1-8b")
    assert code == 0
    printed = out.splitlines()
    stale = [line for line in block.splitlines() if line.strip() != "..." and line not in printed]
    assert not stale, f"README sample is stale, paste the new output: {stale}"


def test_readme_add_a_profile_example_plans() -> None:
    """The README's profile example, run in profiles/llama.py's namespace, gives a plannable profile."""
    import profiles.llama as llama
    from btk import profile as profile_module
    from btk.hardware import get_instance_type
    from btk.planner.search import plan_profile

    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("<!-- readme-example: add-profile -->") :]
    start = section.index("```python\n") + len("```python\n")
    code = section[start : section.index("\n```", start)]
    namespace = dict(vars(llama)) | {"KnobPins": profile_module.KnobPins}
    exec(compile(code, "README.md", "exec"), namespace)
    added = namespace["LLAMA31_8B_LONG"]
    assert added in namespace["PROFILES"] and added.name == "llama3.1-8b-32k"
    plan = plan_profile(added, get_instance_type("ml.p6-b200.48xlarge"), 1)
    assert plan.knobs.precision == "bf16" and plan.knobs.seq_len == 32768
