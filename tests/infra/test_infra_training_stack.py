"""TrainingStack templates: encryption, network, FSx, removal policies, role, outputs, nag."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import cfn_fakes
import pytest
from aws_cdk import Stack
from aws_cdk import aws_s3 as s3
from aws_cdk.assertions import Template
from pydantic import ValidationError
from stack_synth import REPO, Synth, cli_app

import environments
from btk.environment import DataStageConfig, EnvironmentConfig, JobRetryConfig, longest_execution_hours
from btk.hardware import INSTANCE_TYPES
from stacks.training_stack import TrainingStack
from training_constructs.nag import apply_nag

ENVS = {env.name: env for env in environments.ENVIRONMENTS}


def _template(synth: Synth) -> Template:
    return Template.from_json(synth.template)


def _logical_id(synth: Synth, construct: Any) -> str:
    return str(synth.stack.get_logical_id(construct.node.default_child))


# -- encryption -----------------------------------------------------------------------------


def test_key_lets_fsx_service_linked_role_use_it_through_s3_only(synth: Synth) -> None:
    """FSx's per-file-system S3 role must be named in the key policy (its own policy grants no KMS)."""
    (key,) = synth.resources("AWS::KMS::Key").values()
    statements = {st.get("Sid"): st for st in key["Properties"]["KeyPolicy"]["Statement"]}
    if ENVS[synth.env_name].data_stage.mode != "fsx":
        assert "AllowFsxDataRepositoryThroughS3" not in statements  # no file system, no FSx statement
        return
    fsx = statements["AllowFsxDataRepositoryThroughS3"]
    assert fsx["Effect"] == "Allow" and fsx["Principal"] == {"AWS": "*"}
    assert cfn_fakes.resolve(synth.template, fsx["Condition"]["ArnLike"]["aws:PrincipalArn"]) == (
        "arn:aws:iam::123456789012:role/aws-service-role/s3.data-source.lustre.fsx.amazonaws.com/AWSServiceRoleForFSxS3Access_*"
    )
    assert fsx["Condition"]["StringEquals"] == {
        "kms:ViaService": "s3.us-east-1.amazonaws.com", "kms:CallerAccount": "123456789012",
    }
    # Only the datasets bucket's objects (object ARN, or the bucket ARN with an S3 Bucket Key).
    datasets_id = _logical_id(synth, synth.stack.data_stage.datasets_bucket)
    bucket = synth.template["Resources"][datasets_id]
    bucket_name = cfn_fakes.resolve(synth.template, bucket["Properties"]["BucketName"])
    # The name carries the stack's generation: a bucket kept by a destroyed stack never blocks a redeploy.
    assert bucket_name == f"btk-{synth.env_name}-datasets-123456789012-{cfn_fakes.FAKE_STACK_GENERATION}"
    contexts = fsx["Condition"]["StringLike"]["kms:EncryptionContext:aws:s3:arn"]
    expected = [f"arn:aws:s3:::{bucket_name}{suffix}" for suffix in ("", "/*")]
    assert cfn_fakes.resolve(synth.template, contexts) == expected
    assert [skip["id"] for skip in key["Metadata"]["checkov"]["skip"]] == ["CKV_AWS_33"]


def test_key_rotation_and_bucket_encryption(synth: Synth) -> None:
    template = _template(synth)
    template.resource_count_is("AWS::KMS::Key", 1)
    template.has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})
    key_id = _logical_id(synth, synth.stack.key)
    buckets = synth.resources("AWS::S3::Bucket")
    assert len(buckets) == 4
    log_bucket = _logical_id(synth, synth.stack.data_stage.access_log_bucket)
    for logical_id, bucket in buckets.items():
        props = bucket["Properties"]
        sse = props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"]
        if logical_id == log_bucket:
            assert sse == {"SSEAlgorithm": "AES256"}
        else:
            assert sse == {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": {"Fn::GetAtt": [key_id, "Arn"]}}
            assert props["LoggingConfiguration"]["DestinationBucketName"] == {"Ref": log_bucket}
        assert props["PublicAccessBlockConfiguration"] == {
            "BlockPublicAcls": True, "BlockPublicPolicy": True, "IgnorePublicAcls": True, "RestrictPublicBuckets": True,
        }
        assert props["VersioningConfiguration"] == {"Status": "Enabled"}
        rules = {rule["Id"]: rule for rule in props["LifecycleConfiguration"]["Rules"]}
        abort = rules["abort-incomplete-multipart-uploads"]["AbortIncompleteMultipartUpload"]
        assert abort == {"DaysAfterInitiation": 7}
        assert rules["expire-noncurrent-versions"]["NoncurrentVersionExpiration"] == {"NoncurrentDays": 30}


def test_every_bucket_is_ssl_only(synth: Synth) -> None:
    policies = synth.resources("AWS::S3::BucketPolicy")
    protected = {policy["Properties"]["Bucket"]["Ref"] for policy in policies.values()
                 if any(statement["Effect"] == "Deny"
                        and statement.get("Condition") == {"Bool": {"aws:SecureTransport": "false"}}
                        for statement in policy["Properties"]["PolicyDocument"]["Statement"])}
    assert protected == set(synth.resources("AWS::S3::Bucket"))


def test_flow_logs_to_encrypted_log_group(synth: Synth) -> None:
    template = _template(synth)
    key_id = _logical_id(synth, synth.stack.key)
    template.has_resource_properties("AWS::Logs::LogGroup", {
        "KmsKeyId": {"Fn::GetAtt": [key_id, "Arn"]},
        "RetentionInDays": ENVS[synth.env_name].log_retention_days,
    })
    template.has_resource_properties(
        "AWS::EC2::FlowLog", {"TrafficType": "ALL", "LogDestinationType": "cloud-watch-logs"}
    )


# -- network --------------------------------------------------------------------------------


def test_isolated_subnet_in_configured_zone(synth: Synth) -> None:
    config = ENVS[synth.env_name]
    template = _template(synth)
    template.has_resource_properties("AWS::EC2::VPC", {"CidrBlock": config.vpc_cidr})
    _, subnet = synth.one("AWS::EC2::Subnet")
    assert subnet["Properties"]["AvailabilityZone"] == config.availability_zone
    assert subnet["Properties"]["MapPublicIpOnLaunch"] is False
    for forbidden in ("AWS::EC2::InternetGateway", "AWS::EC2::NatGateway"):
        template.resource_count_is(forbidden, 0)
    manifest = json.loads((synth.outdir / "manifest.json").read_text())
    assert "missing" not in manifest, "synth needed a context lookup (AWS access)"


def test_endpoints(synth: Synth) -> None:
    endpoints = synth.resources("AWS::EC2::VPCEndpoint").values()
    services = {json.dumps(e["Properties"]["ServiceName"]): e["Properties"].get("VpcEndpointType") for e in endpoints}
    names = " ".join(services)
    for service in ("ecr.api", "ecr.dkr", ".logs", ".monitoring"):
        assert service in names, service
    # Nothing inside the VPC calls the SageMaker API or STS: no endpoint billed by the hour for them.
    for unused in (".sts", "sagemaker.api"):
        assert unused not in names, unused
    assert sum(kind == "Gateway" and ".s3" in name for name, kind in services.items()) == 1
    assert sum(kind == "Interface" for kind in services.values()) == 4
    for endpoint in endpoints:
        if endpoint["Properties"]["VpcEndpointType"] == "Interface":
            assert endpoint["Properties"]["PrivateDnsEnabled"] is True


def _rules(synth: Synth, resource_type: str, group_id: str, peer_key: str) -> set[tuple[str, Any, Any]]:
    return {
        (r["Properties"]["IpProtocol"], r["Properties"].get("FromPort"), r["Properties"].get("ToPort"))
        for r in synth.resources(resource_type).values()
        if r["Properties"]["GroupId"] == {"Fn::GetAtt": [group_id, "GroupId"]}
        and r["Properties"].get(peer_key) == {"Fn::GetAtt": [group_id, "GroupId"]}
    }


def test_efa_ready_security_group(synth: Synth) -> None:
    group_id = _logical_id(synth, synth.stack.network.security_group)
    ingress = _rules(synth, "AWS::EC2::SecurityGroupIngress", group_id, "SourceSecurityGroupId")
    egress = _rules(synth, "AWS::EC2::SecurityGroupEgress", group_id, "DestinationSecurityGroupId")
    for rules in (ingress, egress):
        assert ("-1", None, None) in rules  # all traffic to and from itself (EFA)
        assert ("tcp", 988, 988) in rules
        assert ("tcp", 1018, 1023) in rules
    group = synth.template["Resources"][group_id]["Properties"]
    assert group["SecurityGroupEgress"] == [
        {"CidrIp": "0.0.0.0/0", "Description": group["SecurityGroupEgress"][0]["Description"],
         "FromPort": 443, "IpProtocol": "tcp", "ToPort": 443}
    ]
    # Nothing but the training group itself may reach the training group.
    for rule in synth.resources("AWS::EC2::SecurityGroupIngress").values():
        if rule["Properties"]["GroupId"] == {"Fn::GetAtt": [group_id, "GroupId"]}:
            assert rule["Properties"]["SourceSecurityGroupId"] == {"Fn::GetAtt": [group_id, "GroupId"]}
    endpoint_group = _logical_id(synth, synth.stack.network.endpoint_security_group)
    _template(synth).has_resource_properties("AWS::EC2::SecurityGroupIngress", {
        "GroupId": {"Fn::GetAtt": [endpoint_group, "GroupId"]},
        "SourceSecurityGroupId": {"Fn::GetAtt": [group_id, "GroupId"]},
        "FromPort": 443, "ToPort": 443, "IpProtocol": "tcp",
    })


# -- data stage -----------------------------------------------------------------------------


def test_fsx_file_system_and_association(synth: Synth) -> None:
    config = ENVS[synth.env_name]
    template = _template(synth)
    if config.data_stage.mode == "s3":
        template.resource_count_is("AWS::FSx::FileSystem", 0)
        template.resource_count_is("AWS::FSx::DataRepositoryAssociation", 0)
        assert "FileSystemId" not in synth.template["Outputs"]
        return
    fs_id, file_system = synth.one("AWS::FSx::FileSystem")
    props = file_system["Properties"]
    assert props["StorageCapacity"] == config.data_stage.fsx_storage_capacity_gib
    assert props["FileSystemTypeVersion"] == "2.15"
    assert props["KmsKeyId"] == {"Ref": _logical_id(synth, synth.stack.key)}
    assert props["LustreConfiguration"] == {
        "DeploymentType": "PERSISTENT_2",
        "PerUnitStorageThroughput": config.data_stage.fsx_throughput_per_tib,
        "DataCompressionType": "LZ4",
        "MetadataConfiguration": {"Mode": "AUTOMATIC"},
    }
    assert props["SubnetIds"] == [{"Ref": _logical_id(synth, synth.stack.network.training_subnet)}]
    group_id = _logical_id(synth, synth.stack.network.security_group)
    assert props["SecurityGroupIds"] == [{"Fn::GetAtt": [group_id, "GroupId"]}]
    datasets = _logical_id(synth, synth.stack.data_stage.datasets_bucket)
    template.has_resource_properties("AWS::FSx::DataRepositoryAssociation", {
        "FileSystemId": {"Ref": fs_id},
        "FileSystemPath": config.data_stage.fsx_directory,
        "DataRepositoryPath": {"Fn::Join": ["", ["s3://", {"Ref": datasets}, "/" + config.data_stage.datasets_prefix]]},
        "BatchImportMetaDataOnCreate": True,
        "S3": {"AutoImportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]},
               "AutoExportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]}},
    })
    outputs = synth.template["Outputs"]
    assert outputs["FileSystemId"]["Value"] == {"Ref": fs_id}
    assert outputs["FileSystemMountName"]["Value"] == {"Fn::GetAtt": [fs_id, "LustreMountName"]}
    assert outputs["FileSystemDirectoryPath"]["Value"] == {
        "Fn::Join": ["", ["/", {"Fn::GetAtt": [fs_id, "LustreMountName"]}, config.data_stage.fsx_directory]]
    }


def test_data_stage_revalidates_fsx_size() -> None:
    from aws_cdk import aws_ec2 as ec2
    from aws_cdk import aws_kms as kms

    from training_constructs.data_stage import DataStage, DataStageProps

    stack = Stack(cli_app(), "Probe")
    vpc = ec2.Vpc(stack, "Vpc", max_azs=1)
    group = ec2.SecurityGroup(stack, "Group", vpc=vpc)
    bad = DataStageConfig.model_construct(mode="fsx", fsx_storage_capacity_gib=1300, fsx_throughput_per_tib=250,
                                          fsx_directory="/datasets", datasets_prefix="datasets/")
    props = DataStageProps(config=bad, key=kms.Key(stack, "Key"), vpc=vpc, subnet=vpc.private_subnets[0],
                           security_group=group)
    with pytest.raises(ValueError, match=r"^Probe/DataStage: data_stage\.fsx_storage_capacity_gib: 1300 GiB"):
        DataStage(stack, "DataStage", props=props)


@pytest.mark.parametrize("env_name", sorted(ENVS))
def test_removal_policies(env_name: str, synths: dict[str, Synth]) -> None:
    synth = synths[env_name]
    expected = "Retain" if ENVS[env_name].retain_data else "Delete"
    kept = ("AWS::S3::Bucket", "AWS::KMS::Key", "AWS::Logs::LogGroup")
    checked = 0
    for resource in synth.template["Resources"].values():
        if resource["Type"] in kept:
            assert resource.get("DeletionPolicy") == expected, resource["Type"]
            assert resource.get("UpdateReplacePolicy") == expected, resource["Type"]
            checked += 1
        if resource["Type"] in ("AWS::FSx::FileSystem", "AWS::FSx::DataRepositoryAssociation"):
            # A cache of the datasets prefix: kept, it would keep its subnet and security group too.
            assert resource.get("DeletionPolicy") == "Delete", resource["Type"]
    assert checked >= 6


@pytest.mark.parametrize("env_name", sorted(ENVS))
def test_checkpoint_objects_expire_only_where_configured(env_name: str, synths: dict[str, Synth]) -> None:
    """SageMaker never deletes pruned checkpoints from S3: the checkpoint bucket expires them
    after data_stage.checkpoint_expiration_days, and only that bucket."""
    days = ENVS[env_name].data_stage.checkpoint_expiration_days
    expiring = {}
    for logical_id, bucket in synths[env_name].resources("AWS::S3::Bucket").items():
        rules = {rule["Id"]: rule for rule in bucket["Properties"]["LifecycleConfiguration"]["Rules"]}
        if "expire-checkpoints" in rules:
            expiring[logical_id] = rules["expire-checkpoints"]
    if days is None:
        assert expiring == {}
    else:
        assert len(expiring) == 1 and "Checkpoints" in next(iter(expiring))
        assert next(iter(expiring.values()))["ExpirationInDays"] == days
        # a retry resumes from the first job's checkpoints: they outlive the whole execution
        assert days * 24 > longest_execution_hours(ENVS[env_name])


def test_checkpoint_expiry_must_outlast_every_retry_and_its_wait() -> None:
    """The longest execution: (retries + 1) jobs of max_runtime_hours (x SPOT_WAIT_FACTOR with spot),
    plus interval_seconds x backoff_rate^(n-1) before retry n."""
    base = {"name": "qa", "availability_zone": "us-east-1a", "profiles": ("llama3.2-1b",), "max_runtime_hours": 24}
    retries = JobRetryConfig(max_attempts=2, interval_seconds=3600, backoff_rate=3.0)
    one_job = EnvironmentConfig.model_validate({**base, "job_retries": JobRetryConfig(max_attempts=0)})
    retried = EnvironmentConfig.model_validate({**base, "job_retries": retries})
    assert longest_execution_hours(one_job) == 24.0
    # 3 jobs x 24 h + waits of 1 h and 3 h
    assert longest_execution_hours(retried) == 3 * 24 + 1 + 3
    spot = EnvironmentConfig.model_validate(
        {**base, "instance_type": "ml.p5.48xlarge", "managed_spot": True, "job_retries": retries}
    )
    assert longest_execution_hours(spot) == 3 * 48 + 1 + 3
    # 3 days outlast one job (24 h) but not the retried execution (76 h)
    three_days = DataStageConfig(checkpoint_expiration_days=3)
    assert EnvironmentConfig.model_validate(
        {**base, "job_retries": JobRetryConfig(max_attempts=0), "data_stage": three_days}
    ).data_stage == three_days
    with pytest.raises(ValidationError, match=r"checkpoint_expiration_days \(3\) must outlast the longest execution "
                       r"\(76\.0 h: 3 jobs of up to 24 h"):
        EnvironmentConfig.model_validate({**base, "job_retries": retries, "data_stage": three_days})


# -- role -----------------------------------------------------------------------------------

STAR_ACTIONS = {
    "ecr:GetAuthorizationToken", "cloudwatch:PutMetricData", "fsx:DescribeFileSystems",
    "ec2:DescribeNetworkInterfaces", "ec2:DescribeVpcs", "ec2:DescribeDhcpOptions", "ec2:DescribeSubnets",
    "ec2:DescribeSecurityGroups",
}


def _role_statements(synth: Synth) -> list[dict[str, Any]]:
    role_id = _logical_id(synth, synth.stack.execution_role.role)
    statements = []
    for policy in synth.resources("AWS::IAM::Policy").values():
        if {"Ref": role_id} in policy["Properties"]["Roles"]:
            statements += policy["Properties"]["PolicyDocument"]["Statement"]
    assert statements
    return statements


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def test_role_trust_and_no_unexpected_wildcards(synth: Synth) -> None:
    role_id = _logical_id(synth, synth.stack.execution_role.role)
    trust = synth.template["Resources"][role_id]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert [s["Principal"] for s in trust] == [{"Service": "sagemaker.amazonaws.com"}]
    assert trust[0]["Condition"] == {"StringEquals": {"aws:SourceAccount": ENVS[synth.env_name].account}}
    assert not synth.template["Resources"][role_id]["Properties"].get("ManagedPolicyArns")
    for statement in _role_statements(synth):
        actions = _as_list(statement["Action"])
        assert statement["Effect"] == "Allow"
        assert all("*" not in action for action in actions), actions
        if "*" in _as_list(statement["Resource"]):
            assert set(actions) <= STAR_ACTIONS, actions
            assert statement["Resource"] == "*"


def test_role_scopes(synth: Synth) -> None:
    statements = _role_statements(synth)
    by_action: dict[str, list[dict[str, Any]]] = {}
    for statement in statements:
        for action in _as_list(statement["Action"]):
            by_action.setdefault(action, []).append(statement)
    datasets = _logical_id(synth, synth.stack.data_stage.datasets_bucket)
    get_resources = [json.dumps(r) for s in by_action["s3:GetObject"] for r in _as_list(s["Resource"])]
    datasets_objects = [r for r in get_resources if datasets in r]
    assert datasets_objects and all("/datasets/*" in r for r in datasets_objects)
    assert not any(datasets in json.dumps(s["Resource"]) for s in by_action["s3:PutObject"])
    listing = [s for s in by_action["s3:ListBucket"] if datasets in json.dumps(s["Resource"])]
    assert listing[0]["Condition"] == {"StringLike": {"s3:prefix": ["datasets/*"]}}
    assert by_action["cloudwatch:PutMetricData"][0]["Condition"] == {
        "StringEquals": {"cloudwatch:namespace": "/aws/sagemaker/TrainingJobs"}}
    for action in ("ec2:CreateNetworkInterfacePermission", "ec2:DeleteNetworkInterface"):
        for statement in by_action[action]:
            assert "ec2:Vpc" in statement["Condition"]["StringEquals"]
    eni = [s for s in by_action["ec2:CreateNetworkInterface"] if "network-interface" in json.dumps(s["Resource"])]
    assert set(eni[0]["Condition"]["StringEquals"]) == {"ec2:Subnet", "ec2:Vpc"}
    assert set(by_action["ec2:CreateNetworkInterfacePermission"][0]["Condition"]["StringEquals"]) == {"ec2:Vpc"}
    logs = json.dumps(by_action["logs:PutLogEvents"][0]["Resource"])
    assert "/aws/sagemaker/TrainingJobs:*" in logs and "/aws/sagemaker/ProcessingJobs:*" in logs
    # CreateLogGroup is authorized on the group's ARN itself, which ends in the name (no ":*").
    created = [cfn_fakes.resolve(synth.template, r)
               for s in by_action["logs:CreateLogGroup"] for r in _as_list(s["Resource"])]
    assert len(created) == 2 and all(r.endswith("Jobs") and ":*" not in r for r in created), created
    key_arn = {"Fn::GetAtt": [_logical_id(synth, synth.stack.key), "Arn"]}
    assert all(s["Resource"] == key_arn for s in by_action["kms:Decrypt"])
    # OutputDataConfig.KmsKeyId: SageMaker requires kms:Encrypt of the execution role.
    assert [s["Resource"] for s in by_action["kms:Encrypt"]] == [key_arn]
    assert ("fsx:DescribeFileSystems" in by_action) == (ENVS[synth.env_name].data_stage.mode == "fsx")
    assert by_action["ecr:BatchGetImage"]


def test_outputs(synth: Synth) -> None:
    outputs = synth.template["Outputs"]
    for name in ("DatasetsBucketName", "CheckpointsBucketName", "ArtifactsBucketName", "ImageUri",
                 "ExecutionRoleArn", "TrainingSubnetId", "TrainingSecurityGroupId"):
        assert name in outputs, name
    assert outputs["ExecutionRoleArn"]["Value"] == {
        "Fn::GetAtt": [_logical_id(synth, synth.stack.execution_role.role), "Arn"]}
    assert "container-assets" in json.dumps(outputs["ImageUri"]["Value"])
    # Failure alerts reach whoever subscribes to this topic.
    (topic_id, _), = synth.resources("AWS::SNS::Topic").items()
    assert outputs["FailureTopicArn"]["Value"] == {"Ref": topic_id}
    emails = ENVS[synth.env_name].notification_emails
    subscriptions = synth.resources("AWS::SNS::Subscription").values()
    assert sorted(s["Properties"]["Endpoint"] for s in subscriptions if s["Properties"]["Protocol"] == "email") == (
        sorted(emails))


def test_notification_emails_are_subscribed_to_the_failure_topic() -> None:
    env = ENVS[next(iter(ENVS))]
    config = env.model_copy(update={"notification_emails": ("ml-oncall@example.com", "lead@example.com")})
    app = cli_app()
    stack = TrainingStack(app, "TrainingStack", env_config=config)
    template = Template.from_stack(stack).to_json()
    topics = [lid for lid, r in template["Resources"].items() if r["Type"] == "AWS::SNS::Topic"]
    subscriptions = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::SNS::Subscription"]
    assert sorted(s["Endpoint"] for s in subscriptions) == ["lead@example.com", "ml-oncall@example.com"]
    assert all(s["Protocol"] == "email" and s["TopicArn"] == {"Ref": topics[0]} for s in subscriptions)


def test_stack_identity_and_tags(synth: Synth) -> None:
    config = ENVS[synth.env_name]
    assert synth.stack.stack_name == f"TrainingStack-{config.name}"
    assert synth.stack.node.id == "TrainingStack"
    _, vpc = synth.one("AWS::EC2::VPC")
    tags = {tag["Key"]: tag["Value"] for tag in vpc["Properties"]["Tags"]}
    assert {k: tags[k] for k in config.tags} == config.tags
    assert "AWS::CDK::Metadata" not in {r["Type"] for r in synth.template["Resources"].values()}


def test_image_asset_is_built_for_the_instances_cpu(synth: Synth) -> None:
    """linux/amd64, or linux/arm64 where the instance type's CPU is Grace (the hardware catalog says which)."""
    instance = INSTANCE_TYPES.get(ENVS[synth.env_name].instance_type)
    expected = "linux/arm64" if instance is not None and instance.cpu_architecture == "arm64" else "linux/amd64"
    assets = json.loads((synth.outdir / f"{synth.stack.artifact_id}.assets.json").read_text())
    images = list(assets["dockerImages"].values())
    assert len(images) == 1
    assert images[0]["source"]["platform"] == expected
    assert images[0]["source"]["directory"].startswith("asset.")


# -- cdk-nag --------------------------------------------------------------------------------


def test_no_unacknowledged_nag_findings(synth: Synth) -> None:
    from cdk_nag import AwsSolutionsChecks

    report = AwsSolutionsChecks().validate_scope(synth.app)
    assert report.success, [v.rule_name for v in report.violations]
    validation = synth.outdir / "validation-report.json"
    if validation.exists():
        for plugin in json.loads(validation.read_text())["pluginReports"]:
            assert plugin["conclusion"] == "success", plugin


def test_nag_fails_synth_on_a_finding(tmp_path: Path) -> None:
    """The control: the same wiring rejects an unencrypted, non-SSL bucket."""
    app = cli_app(outdir=str(tmp_path))
    s3.Bucket(Stack(app, "Bad"), "Bucket")
    apply_nag(app)
    with pytest.raises(RuntimeError, match="AwsSolutions-S10"):
        app.synth()


def test_acknowledgement_needs_a_reason() -> None:
    from training_constructs.nag import acknowledge

    with pytest.raises(ValueError, match="concrete reason"):
        acknowledge(Stack(cli_app(), "S"), "AwsSolutions-IAM5[Resource::*]", "needed")


# -- determinism ----------------------------------------------------------------------------


#: Loaded by the synth process (PYTHONPATH): any IPv4/IPv6 connection attempt fails the synth.
NO_NETWORK = """
import socket
_connect = socket.socket.connect
def _refuse(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        raise OSError(f"network call during synth: {address}")
    return _connect(self, address)
socket.socket.connect = _refuse
socket.socket.connect_ex = _refuse
"""
#: Credential sources the AWS SDKs would read; none may exist for an offline synth.
CREDENTIAL_VARIABLES = ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                        "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")


def _synth_process(outdir: Path, env_name: str) -> subprocess.CompletedProcess[str]:
    """app.py as the CDK CLI runs it (cdk.json's context and ``-c env=``), with no AWS credentials and
    Python's network cut."""
    from app import project_context

    guard = outdir.parent / "no-network"
    guard.mkdir(exist_ok=True)
    (guard / "sitecustomize.py").write_text(NO_NETWORK)
    env = {key: value for key, value in os.environ.items() if key not in CREDENTIAL_VARIABLES}
    env.update({
        "CDK_OUTDIR": str(outdir),
        "CDK_CONTEXT_JSON": json.dumps({**project_context(), "env": env_name}),
        "PYTHONPATH": str(guard),
        "AWS_CONFIG_FILE": str(guard / "absent-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(guard / "absent-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
    })
    return subprocess.run([sys.executable, "app.py"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def test_network_guard_refuses_connections(tmp_path: Path) -> None:
    """The control for the offline synths below: the guard really cuts the network."""
    (tmp_path / "sitecustomize.py").write_text(NO_NETWORK)
    probe = "import socket; socket.create_connection(('127.0.0.1', 9), timeout=1)"
    result = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": str(tmp_path)},
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode != 0
    assert "network call during synth" in result.stderr


@pytest.mark.slow  # the synth's determinism, whatever environments.py holds: not re-run on another user's config
def test_two_synths_are_byte_identical(tmp_path: Path, synths: dict[str, Synth]) -> None:
    """An offline synth (no credentials, no network, its own process and hash seed) gives the same bytes as
    the session's synth of the same environment."""
    env_name = next(iter(ENVS))
    offline, shared = tmp_path / "offline", synths[env_name].outdir
    result = _synth_process(offline, env_name)
    assert result.returncode == 0, result.stderr[-2000:]
    for name in ("TrainingStack.template.json", "TrainingStack.assets.json"):
        a, b = (offline / name).read_text().splitlines(), (shared / name).read_text().splitlines()
        differing = [(x, y) for x, y in zip(a, b, strict=False) if x != y][:3]
        assert (offline / name).read_bytes() == (shared / name).read_bytes(), f"{name}: {differing}"
