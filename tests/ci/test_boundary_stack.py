"""Each environment's permissions boundary, the bootstrap command that applies it, and a reserve-mode
TrainingStack: through the CDK CLI as cdk.json runs the app, and past cdk-nag, cfn-lint and checkov."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fixture_catalog
import pytest
from reserve_variant import reserve_environment, synthesize_boundary, synthesize_environment

import environments
from btk.bootstrap import bootstrap_commands, boundary_assembly_dir
from btk.errors import BtkError

REPO = Path(__file__).resolve().parents[2]
CHECKOV = REPO / ".venv-checkov" / "bin" / "checkov"
CDK = REPO / "node_modules" / ".bin" / "cdk"
ENVS = {env.name: env for env in environments.ENVIRONMENTS}
ACCOUNT = "123456789012"


def lint(template: dict[str, Any], path: Path) -> None:
    """cfn-lint (always) and checkov (its own venv, ``make .venv-checkov/.installed``) on ``template``."""
    path.write_text(json.dumps(template))
    cfn_lint_bin = Path(sys.executable).parent / "cfn-lint"
    cfn_lint = subprocess.run([str(cfn_lint_bin), str(path)], capture_output=True, text=True)
    assert cfn_lint.returncode == 0, cfn_lint.stdout + cfn_lint.stderr
    if not CHECKOV.exists():
        pytest.skip("checkov is not installed here: make .venv-checkov/.installed")
    checkov = subprocess.run(
        [str(CHECKOV), "--quiet", "--compact", "--skip-download", "--framework", "cloudformation", "-f", str(path)],
        capture_output=True, text=True,
    )
    assert checkov.returncode == 0, checkov.stdout[-3000:]


@pytest.mark.parametrize("name", sorted(ENVS))
def test_the_boundary_passes_the_linters(name: str, tmp_path: Path) -> None:
    template = synthesize_boundary(ENVS[name], environments.ENVIRONMENTS)  # cdk-nag raises on a finding
    lint(template, tmp_path / f"BtkBoundary-{name}.template.json")


def test_the_boundary_synthesizes_as_the_cdk_cli_runs_the_app(tmp_path: Path) -> None:
    """The documented command's synth, through cdk.json (its feature flags, ``validateAgainstDefaultRules``
    among them, which refuses an ARN pattern CloudFormation's schema does not accept)."""
    env = environments.ENVIRONMENTS[-1]
    command = bootstrap_commands(env, ACCOUNT, cdk=str(CDK)).boundary
    deploy_at, output_at = command.index("deploy"), command.index("-o")
    assert command[output_at + 1] == boundary_assembly_dir(env)  # where cdk bootstrap --app reads it
    synth = [*command[:deploy_at], "synth", *command[deploy_at + 1:output_at], *command[output_at + 2:], "--quiet",
             "-o", str(tmp_path)]
    clean = {key: value for key, value in os.environ.items() if not key.startswith("AWS_")}
    result = subprocess.run(synth, cwd=REPO, capture_output=True, text=True, env={**clean, "AWS_REGION": env.region},
                            check=False)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    template = json.loads((tmp_path / f"BtkBoundary-{env.name}.template.json").read_text())
    (policy,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::IAM::ManagedPolicy"]
    assert policy["Properties"]["ManagedPolicyName"] == f"cdk-{env.bootstrap_qualifier}-boundary-{env.region}"


def test_deploy_md_shows_the_commands_btk_bootstrap_runs() -> None:
    """docs/deploy.md's step 1 shows what ``btk bootstrap --env staging --account 123456789012`` runs for an
    environment named staging of the default qualifier and region (``--no-notices`` aside)."""
    text = (REPO / "docs" / "deploy.md").read_text()
    block = text[text.index("`btk bootstrap` prints and runs two commands:"):]
    block = block[block.index("```bash\n") + len("```bash\n"):]
    shown = [" ".join(line.split()) for line in block[:block.index("```")].replace("\\\n", " ").splitlines()
             if line.strip()]
    commands = bootstrap_commands(fixture_catalog.STAGING, "123456789012", cdk="npx cdk")
    assert shown == [shlex.join(part for part in command if part != "--no-notices")
                     for command in (commands.boundary, commands.bootstrap)]


def test_the_bootstrap_is_customised_only_through_the_cdk_clis_own_flags() -> None:
    """Every flag ``btk bootstrap`` passes to ``cdk bootstrap`` is one the pinned CLI documents; no template."""
    help_text = subprocess.run([str(CDK), "bootstrap", "--help"], capture_output=True, text=True, check=True,
                               env={**os.environ, "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}).stdout
    command = bootstrap_commands(environments.ENVIRONMENTS[0], ACCOUNT).bootstrap
    flags = [part for part in command if part.startswith("--")]
    assert "--template" not in flags
    # The help's first column cuts a long name at 40 characters (--apply-permissions-boundary-to-all-role).
    documented = {token.rstrip(",") for token in help_text.split() if token.startswith("--")}
    missing = [flag for flag in flags
               if not any(flag.replace("--no-", "--") == token or (len(token) >= 40 and flag.startswith(token))
                          for token in documented)]
    assert flags and not missing


def test_a_boundary_too_long_for_iam_is_refused_in_one_line() -> None:
    """Enough environments in one account make the boundary's deny list longer than IAM accepts."""
    first = environments.ENVIRONMENTS[0]
    crowd = [first.model_copy(update={"name": f"team{i}", "bootstrap_qualifier": f"btkteam{i}"}) for i in range(12)]
    with pytest.raises(BtkError, match=r"^environment 'team0': its permissions boundary names 11 other environments "
                                       r".* over IAM's 6144: give environments accounts of their own"):
        synthesize_boundary(crowd[0], crowd)


def test_a_reserve_mode_training_stack_passes_the_linters(tmp_path: Path) -> None:
    env = reserve_environment(environments.ENVIRONMENTS[-1], datetime(2027, 1, 4, tzinfo=UTC))
    template = synthesize_environment(env, tmp_path / "out")  # cdk-nag raises on a finding
    assert any(r["Type"] == "Custom::TrainingPlan" for r in template["Resources"].values())
    lint(template, tmp_path / "TrainingStack-reserve.template.json")
