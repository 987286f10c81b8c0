"""The toolkit's tests hold for any valid ``profiles/`` and ``environments.py``, not just the shipped ones.

A copy of the project gets a different profile family (one Mistral-7B-shaped profile) in
place of ``profiles/`` and two environments of other names in place of ``environments.py``;
the non-slow tests then run there. A test that names a shipped profile or environment fails
in the copy: such a test should derive its inputs from the config or use fixtures. The property
suites draw at most :data:`RERUN_EXAMPLES` examples each there (``example_budget``): whether a test
depends on the shipped config shows in its first examples; the main run proves the properties.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from example_budget import CAP_ENV
from test_readme_add_profile import copy_project, run

pytestmark = pytest.mark.slow

PROFILES_PACKAGE = '''"""One family: a Mistral-7B-shaped profile."""

from __future__ import annotations

from btk.profile import ModelProfile
from profiles import mistral

FAMILY_MODULES = (mistral,)

PROFILES: tuple[ModelProfile, ...] = tuple(profile for module in FAMILY_MODULES for profile in module.PROFILES)
'''
MISTRAL_MODULE = '''"""Mistral 7B v0.3: grouped-query attention, 32k vocabulary."""

from __future__ import annotations

from btk.profile import ModelArchitecture, ModelProfile, TrainingIntent

MISTRAL_7B = ModelProfile(
    name="mistral-7b",
    family="mistral",
    description="Mistral 7B v0.3",
    architecture=ModelArchitecture(
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_kv_heads=8,
        ffn_hidden_size=14336,
        vocab_size=32768,
        max_context=32768,
        rope_theta=1_000_000.0,
    ),
    training=TrainingIntent(seq_len=4096, global_batch_tokens=2_097_152, total_tokens=50_000_000_000),
    published_parameter_count=7_248_023_552,
    source="huggingface.co/mistralai/Mistral-7B-v0.3 config.json",
    hf_model_id="mistralai/Mistral-7B-v0.3",
)

PROFILES = (MISTRAL_7B,)
'''
ENVIRONMENTS_MODULE = '''"""Two environments of names the shipped example does not use."""

from __future__ import annotations

from btk.environment import DataStageConfig, EnvironmentConfig

SANDBOX = EnvironmentConfig(
    name="sandbox",
    region="us-west-2",
    availability_zone="us-west-2b",
    profiles=("mistral-7b",),
    data_stage=DataStageConfig(mode="s3", checkpoint_expiration_days=14),
    retain_data=False,
    log_retention_days=7,
)

LIVE = EnvironmentConfig(
    name="live",
    region="us-east-1",
    availability_zone="us-east-1b",
    profiles=("mistral-7b",),
    instance_count=2,
    data_stage=DataStageConfig(mode="fsx", fsx_storage_capacity_gib=2400, fsx_throughput_per_tib=250),
    retain_data=True,
    log_retention_days=90,
    vpc_cidr="10.90.0.0/16",
)

ENVIRONMENTS: tuple[EnvironmentConfig, ...] = (SANDBOX, LIVE)
DEFAULT_ENVIRONMENT = "sandbox"
'''
# The folders whose tests read profiles/ or environments.py (tests/trainer reads neither but for test_bench).
FOLDERS = (
    "tests/capacity", "tests/ci", "tests/cli", "tests/core", "tests/hostile", "tests/infra", "tests/pipeline",
    "tests/planner", "tests/report", "tests/trainer/test_bench.py",
)
#: deploy.yml is written for the shipped dev / staging / prod: these check it against environments.py,
#: so they are checks of the shipped example (a user who changes environments.py updates deploy.yml).
DEPLOY_WORKFLOW_CHECKS = (
    "test_every_environment_has_a_chained_oidc_deploy_job",
    "test_deploys_follow_the_order_of_environments",
    "test_each_deploy_job_uses_oidc_and_one_deploy_at_a_time",
    "test_pushes_deploy_everything_and_dispatch_deploys_up_to_the_choice",
    "test_an_environment_without_a_deploy_job_fails_with_what_to_add",
    "test_a_deploy_job_for_an_unknown_environment_is_reported",
    "test_rules_catch_a_broken_chain_permissions_concurrency_and_keys",
)
#: Each property suite's examples in the re-run.
RERUN_EXAMPLES = 10
# Left out, each with its reason.
EXCLUDED = {
    "tests/cli/test_user_config_cli.py::test_readme_add_a_profile_example_plans": "the README's example extends the "
    "shipped profiles/llama.py",
    **{f"tests/ci/test_ci_workflows.py::{name}": "deploy.yml is the shipped example's"
       for name in DEPLOY_WORKFLOW_CHECKS},
}


def replace_user_config(project: Path) -> None:
    """``profiles/`` becomes one Mistral module; ``environments.py`` becomes SANDBOX and LIVE."""
    shutil.rmtree(project / "profiles")
    (project / "profiles").mkdir()
    (project / "profiles" / "__init__.py").write_text(PROFILES_PACKAGE)
    (project / "profiles" / "mistral.py").write_text(MISTRAL_MODULE)
    (project / "environments.py").write_text(ENVIRONMENTS_MODULE)


def test_the_non_slow_tests_hold_for_another_users_config(tmp_path: Path) -> None:
    project = tmp_path / "project"
    copy_project(project)
    replace_user_config(project)

    plan = run(project, "-m", "btk.cli", "plan", "--env", "live", "--format", "json")
    assert plan.returncode == 0, plan.stderr

    deselected = [f"--deselect={test}" for test in EXCLUDED]
    tests = run(project, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *deselected, *FOLDERS,
                env={CAP_ENV: str(RERUN_EXAMPLES)})
    assert tests.returncode == 0, tests.stdout[-6000:] + tests.stderr[-2000:]
