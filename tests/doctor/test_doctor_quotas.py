"""Service Quotas checks: SageMaker training (instance type, per job, across jobs, run time) and FSx for Lustre."""

from __future__ import annotations

import fixture_catalog
import pytest
from doctor_fixtures import (
    REGION,
    by_service,
    doctor,
    findings_of,
    fsx_quotas,
    gib_to_mbps,
    healthy_account,
    jobs_of,
    lustre_file_system,
    quota_code,
    quota_listing,
    training_quotas,
    variant,
)

from btk.catalog import get_environment
from btk.doctor.quotas import instance_quota_name
from btk.environment import EnvironmentConfig


def run(env: EnvironmentConfig, *, sagemaker: dict[str, float] | None = None, fsx: dict[str, float] | None = None,
        sagemaker_defaults: dict[str, float] | None = None, file_systems: list[dict[str, object]] | None = None,
        capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, str]]:  # fmt: skip
    """``btk doctor`` on a prepared account whose quotas (and other file systems) are replaced as given."""
    jobs = jobs_of(env)
    aws = healthy_account(env, jobs)
    applied = {"sagemaker": sagemaker or training_quotas(env, jobs), "fsx": fsx or fsx_quotas()}
    aws.answers[("service-quotas", "ListServiceQuotas")] = by_service(
        {service: quota_listing(values, service) for service, values in applied.items()}
    )
    if sagemaker_defaults is not None:
        aws.answers[("service-quotas", "ListAWSDefaultServiceQuotas")] = by_service(
            {"sagemaker": quota_listing(sagemaker_defaults, "sagemaker"), "fsx": quota_listing(fsx_quotas(), "fsx")}
        )
    if file_systems is not None:
        aws.answers[("fsx", "DescribeFileSystems")] = {"FileSystems": file_systems}
    code, lines = doctor(env.name, aws, capsys)
    aws.done()
    return code, findings_of(lines)


def largest(env: EnvironmentConfig) -> int:
    return max(job.instance_count for job in jobs_of(env))


def every(env: EnvironmentConfig) -> int:
    return sum(job.instance_count for job in jobs_of(env))


@pytest.mark.parametrize("env_name", sorted(fixture_catalog.ENVIRONMENTS))
def test_an_instance_type_quota_of_zero_fails_with_the_request_to_make(
    env_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    env = get_environment(env_name)
    name = instance_quota_name(env.instance_type, spot=False)
    quotas = {**training_quotas(env, jobs_of(env)), name: 0}
    code, found = run(env, sagemaker=quotas, capsys=capsys)
    assert code == 1
    line = found[f"quota '{name}'"]
    assert line.startswith(f"FAIL quota '{name}': 0 instances (applied), {largest(env)} needed")
    assert line.endswith(
        f"-> request '{name}' >= {largest(env)}: aws service-quotas request-service-quota-increase "
        f"--service-code sagemaker --quota-code {quota_code(name)} --desired-value {largest(env)} --region {REGION}"
    )
    assert [check for check, text in found.items() if text.startswith("FAIL")] == [f"quota '{name}'"]


def test_room_for_one_job_but_not_every_profile_at_once_warns(capsys: pytest.CaptureFixture[str]) -> None:
    env = get_environment("prod")
    name = instance_quota_name(env.instance_type, spot=False)
    code, found = run(env, sagemaker={**training_quotas(env, jobs_of(env)), name: largest(env)}, capsys=capsys)
    assert code == 0
    line = found[f"quota '{name}'"]
    assert line.startswith("WARN ")
    assert f"{largest(env)} needed ({every(env)} for every profile at once): " in line
    assert f" -> request '{name}' >= {every(env)}: " in line


def test_a_quota_with_no_applied_value_is_read_from_aws_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    env = get_environment("dev")
    name = instance_quota_name(env.instance_type, spot=False)
    applied = {k: v for k, v in training_quotas(env, jobs_of(env)).items() if k != name}
    code, found = run(env, sagemaker=applied, sagemaker_defaults={name: 0}, capsys=capsys)
    assert code == 1
    assert found[f"quota '{name}'"].startswith(f"FAIL quota '{name}': 0 instances (AWS default, none applied)")


def test_a_quota_the_region_does_not_list_warns(capsys: pytest.CaptureFixture[str]) -> None:
    env = get_environment("dev")
    name = instance_quota_name(env.instance_type, spot=False)
    applied = {k: v for k, v in training_quotas(env, jobs_of(env)).items() if k != name}
    code, found = run(env, sagemaker=applied, sagemaker_defaults={}, capsys=capsys)
    assert code == 0
    assert found[f"quota '{name}'"].startswith(
        f"WARN quota '{name}': no quota of that name in {REGION}'s Service Quotas (sagemaker)"
    )


def test_per_job_limit_below_the_planned_count_fails(capsys: pytest.CaptureFixture[str]) -> None:
    env = get_environment("prod")
    assert largest(env) > 1
    per_job = "Maximum number of instances per training job"
    code, found = run(env, sagemaker={**training_quotas(env, jobs_of(env)), per_job: 1}, capsys=capsys)
    assert code == 1
    assert found[f"quota '{per_job}'"].startswith(f"FAIL quota '{per_job}': 1 instances (applied), {largest(env)}")
    assert found[f"quota '{per_job}'"].endswith("; or lower instance_count in environments.py")
    assert "; or or " not in found[f"quota '{per_job}'"]


def test_a_run_time_quota_below_max_runtime_fails(capsys: pytest.CaptureFixture[str]) -> None:
    env = get_environment("dev")
    longest = "Longest run time for a training job"
    shorter = env.max_runtime_seconds - 3600
    code, found = run(env, sagemaker={**training_quotas(env, jobs_of(env)), longest: shorter}, capsys=capsys)
    assert code == 1
    assert found[f"quota '{longest}'"].startswith(
        f"FAIL quota '{longest}': {shorter:,} s (applied), {env.max_runtime_seconds:,} needed: "
        f"max_runtime_hours {env.max_runtime_hours}"
    )
    assert found[f"quota '{longest}'"].endswith("; or lower max_runtime_hours in environments.py")


def spot_environment() -> EnvironmentConfig:
    """dev on an instance type the catalog shows offered for managed spot."""
    dev = get_environment("dev")
    stage = dev.data_stage.model_copy(update={"checkpoint_expiration_days": 30})
    return variant(dev, name="spot", instance_type="ml.p5.48xlarge", managed_spot=True, data_stage=stage.model_dump())


def test_with_spot_the_spot_quotas_bind_and_on_demand_only_warns(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = spot_environment()
    fixture_catalog.install(monkeypatch, env)
    spot, on_demand = (instance_quota_name(env.instance_type, spot=s) for s in (True, False))
    quotas = training_quotas(env, jobs_of(env))
    code, found = run(env, sagemaker={**quotas, on_demand: 0}, capsys=capsys)
    assert code == 0
    assert found[f"quota '{on_demand}'"].startswith(f"WARN quota '{on_demand}': 0 instances")
    assert found[f"quota '{on_demand}'"].endswith("; or jobs on managed spot do not use it")
    assert found[f"quota '{spot}'"].startswith("PASS ")
    assert "quota 'Maximum number of instances per spot training job'" in found
    assert "quota 'Number of instances across all spot training jobs'" in found
    code, found = run(env, sagemaker={**quotas, spot: 0}, capsys=capsys)
    assert code == 1
    assert found[f"quota '{spot}'"].startswith(f"FAIL quota '{spot}': 0 instances")


def test_on_a_training_plan_an_on_demand_shortfall_warns(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    arn = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/btk-plan"
    env = variant(get_environment("dev"), name="planned", capacity={"mode": "existing", "plan_arn": arn})
    fixture_catalog.install(monkeypatch, env)
    name = instance_quota_name(env.instance_type, spot=False)
    jobs = jobs_of(env)
    aws = healthy_account(env, jobs)
    aws.answers[("service-quotas", "ListServiceQuotas")] = by_service(
        {"sagemaker": quota_listing({**training_quotas(env, jobs), name: 0}, "sagemaker")}
    )
    aws.answers[("sagemaker", "DescribeTrainingPlan")] = {"TrainingPlanArn": arn, "TrainingPlanName": "btk-plan",
                                                          "Status": "Active"}  # fmt: skip
    _, lines = doctor(env.name, aws, capsys)
    line = findings_of(lines)[f"quota '{name}'"]
    assert line.startswith(f"WARN quota '{name}': 0 instances")
    assert line.endswith("; or jobs on the training plan do not use it")


# --------------------------------------------------------------------------- FSx for Lustre


def test_fsx_storage_counts_the_account_s_other_file_systems(capsys: pytest.CaptureFixture[str]) -> None:
    env = get_environment("prod")
    stage = env.data_stage
    others = [
        lustre_file_system("fs-0aaaaaaaaaaaaaaa1", 48_000, 125),
        lustre_file_system("fs-0aaaaaaaaaaaaaaa2", 2400, 250),
    ]
    own = lustre_file_system("fs-0own0000000000000", stage.fsx_storage_capacity_gib, stage.fsx_throughput_per_tib)
    needed = stage.fsx_storage_capacity_gib + 48_000 + 2400
    storage = "Lustre Persistent_2 storage capacity"
    code, found = run(env, fsx=fsx_quotas(storage_gib=needed - 1), file_systems=[own, *others], capsys=capsys)
    assert code == 1
    assert found[f"quota '{storage}'"].startswith(
        f"FAIL quota '{storage}': {needed - 1:,} GiB (applied), {needed:,} needed: "
        f"{stage.fsx_storage_capacity_gib:,} GiB configured + {48_000 + 2400:,} GiB already in the account (2 file "
        "systems)"
    )
    assert (
        f"--service-code fsx --quota-code {quota_code(storage)} --desired-value {needed} "
        in found[f"quota '{storage}'"]
    )
    code, found = run(env, fsx=fsx_quotas(storage_gib=needed), file_systems=[own, *others], capsys=capsys)
    assert (code, found[f"quota '{storage}'"][:4]) == (0, "PASS")


def test_fsx_file_system_count_needs_room_for_one_more(capsys: pytest.CaptureFixture[str]) -> None:
    env = get_environment("staging")
    others = [lustre_file_system(f"fs-0bbbbbbbbbbbbbbb{i}", 1200, 125) for i in range(3)]
    count = "Lustre Persistent_2 file systems"
    code, found = run(env, fsx=fsx_quotas(file_systems=3), file_systems=others, capsys=capsys)
    assert code == 1
    assert found[f"quota '{count}'"].startswith(f"FAIL quota '{count}': 3 file systems (applied), 4 needed")


def test_a_persistent_2_throughput_quota_is_checked_where_the_region_lists_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = get_environment("prod")
    stage = env.data_stage
    mine = gib_to_mbps(stage.fsx_storage_capacity_gib, stage.fsx_throughput_per_tib)
    other = lustre_file_system("fs-0ccccccccccccccc1", 2400, 1000)
    throughput = "Lustre Persistent_2 throughput capacity"
    needed = mine + gib_to_mbps(2400, 1000)
    code, found = run(env, fsx={**fsx_quotas(), throughput: needed - 1}, file_systems=[other], capsys=capsys)
    assert code == 1
    assert found[f"quota '{throughput}'"].startswith(f"FAIL quota '{throughput}': {needed - 1:,.2f} MB/s (applied)")
    # without such a quota the line says so and passes: the size tier bounds throughput
    code, found = run(env, file_systems=[other], capsys=capsys)
    assert code == 0
    assert found[f"quota '{throughput}'"].startswith(f"PASS quota '{throughput}': {REGION} lists no Persistent_2")


def test_an_s3_environment_has_no_fsx_checks(capsys: pytest.CaptureFixture[str]) -> None:
    env = get_environment("dev")
    assert env.data_stage.mode == "s3"
    _, found = run(env, capsys=capsys)
    assert not [check for check in found if "Lustre" in check]
