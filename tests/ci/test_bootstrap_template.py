"""Each environment's scoped bootstrap and a reserve-mode TrainingStack pass cdk-nag, cfn-lint and checkov."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from reserve_variant import reserve_environment, synthesize_bootstrap, synthesize_environment

import environments
from stacks.bootstrap_stack import BOOTSTRAP_VERSION, role_name

REPO = Path(__file__).resolve().parents[2]
CHECKOV = REPO / ".venv-checkov" / "bin" / "checkov"
ENVS = {env.name: env for env in environments.ENVIRONMENTS}


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
def test_the_bootstrap_passes_the_linters(name: str, tmp_path: Path) -> None:
    template = synthesize_bootstrap(ENVS[name], environments.ENVIRONMENTS)  # cdk-nag raises on a finding
    lint(template, tmp_path / f"BtkBootstrap-{name}.template.json")


@pytest.mark.parametrize("name", sorted(ENVS))
def test_the_bootstrap_has_what_the_cdk_synthesizer_expects(name: str) -> None:
    env = ENVS[name]
    resources = synthesize_bootstrap(env, environments.ENVIRONMENTS)["Resources"]
    names = {json.dumps(r["Properties"].get(key)) for r in resources.values() for key in
             ("RoleName", "BucketName", "RepositoryName", "Name")}
    for kind in ("deploy", "cfn-exec", "file-publishing", "image-publishing", "lookup"):
        assert any(role_name(env.bootstrap_qualifier, kind, "", "").split("--")[0] in n for n in names), kind
    version = next(r for r in resources.values() if r["Type"] == "AWS::SSM::Parameter")["Properties"]
    assert version["Name"] == f"/cdk-bootstrap/{env.bootstrap_qualifier}/version"
    # The CDK CLI's own template (its BootstrapVersion output) is the version this one claims.
    cli_template = (REPO / "node_modules" / "aws-cdk" / "lib" / "api" / "bootstrap" / "bootstrap-template.yaml")
    assert f"Value: '{BOOTSTRAP_VERSION}'" in cli_template.read_text()
    assert version["Value"] == BOOTSTRAP_VERSION


def test_a_reserve_mode_training_stack_passes_the_linters(tmp_path: Path) -> None:
    env = reserve_environment(environments.ENVIRONMENTS[-1], datetime(2027, 1, 4, tzinfo=UTC))
    template = synthesize_environment(env, tmp_path / "out")  # cdk-nag raises on a finding
    assert any(r["Type"] == "Custom::TrainingPlan" for r in template["Resources"].values())
    lint(template, tmp_path / "TrainingStack-reserve.template.json")
