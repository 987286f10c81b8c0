"""S3 → FSx for Lustre data stages: the buckets, the key, and the file system in front.

Datasets live in S3 under ``datasets_prefix``; in ``fsx`` mode an FSx for Lustre
PERSISTENT_2 file system in the training subnet mirrors that prefix at ``fsx_directory``
through a data repository association (lazy load on first read, auto import and export of
new, changed and deleted objects). Checkpoints and artifacts go to their own buckets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aws_cdk import ArnFormat, Duration, RemovalPolicy, Stack, Token
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_fsx as fsx
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from btk.environment import DataStageConfig, validate_fsx_storage_capacity, validate_fsx_throughput
from training_constructs.locations import FileSystemLocation
from training_constructs.nag import acknowledge_wildcard_resources
from training_constructs.removal import GENERATION_CHARS, data_removal_policy, stack_generation

#: Events FSx mirrors between the file system and the bucket, both ways.
DRA_EVENTS = ("NEW", "CHANGED", "DELETED")
#: Noncurrent object versions older than this are deleted.
NONCURRENT_VERSION_DAYS = 30
#: Incomplete multipart uploads older than this are aborted.
ABORT_MULTIPART_DAYS = 7
#: Server access logs are kept this long.
ACCESS_LOG_DAYS = 365
#: Feature flag: server access logs delivered through a bucket policy instead of an ACL.
ACCESS_LOGS_BY_POLICY = "@aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy"
#: Principal ARN pattern of FSx's per-file-system service-linked role that reads S3.
FSX_S3_SERVICE_ROLE = "role/aws-service-role/s3.data-source.lustre.fsx.amazonaws.com/AWSServiceRoleForFSxS3Access_*"


def validate_fsx_settings(storage_capacity_gib: int, throughput_per_tib: int) -> None:
    """Raise ``ValueError`` (one line naming the setting) unless PERSISTENT_2 sells the size and throughput.

    The same rules as ``DataStageConfig``'s validators (they are the same functions): a config
    built without validation (``model_construct``) still cannot reach CloudFormation.
    """
    for name, validate, value in (
        ("fsx_storage_capacity_gib", validate_fsx_storage_capacity, storage_capacity_gib),
        ("fsx_throughput_per_tib", validate_fsx_throughput, throughput_per_tib),
    ):
        try:
            validate(value)
        except ValueError as error:
            raise ValueError(f"data_stage.{name}: {error}") from None


def account_log_groups_condition(stack: Stack) -> dict[str, Any]:
    """Key-policy condition: CloudWatch Logs may use the key only for this account's log groups."""
    log_groups = stack.format_arn(
        service="logs", resource="log-group", resource_name="*", arn_format=ArnFormat.COLON_RESOURCE_NAME
    )
    return {"ArnLike": {"kms:EncryptionContext:aws:logs:arn": log_groups}}


#: Longest S3 bucket name.
BUCKET_NAME_MAX = 63


def datasets_bucket_name(environment: str, stack: Stack) -> str:
    """``btk-<env>-datasets-<account>-<generation>``: a name known before the bucket exists.

    The key's FSx statement names the bucket, and the bucket is encrypted with the key: with a
    CloudFormation-generated name the two would depend on each other. The generation
    (:func:`~training_constructs.removal.stack_generation`) changes with each creation of the
    stack, so a bucket kept by ``retain_data`` never blocks the next deploy.
    """
    prefix = f"btk-{environment}-datasets-{stack.account}-"
    if not Token.is_unresolved(stack.account) and len(prefix) + GENERATION_CHARS > BUCKET_NAME_MAX:
        raise ValueError(
            f"datasets bucket name {prefix}<{GENERATION_CHARS} hex> is over {BUCKET_NAME_MAX} characters: "
            "shorten the environment"
        )
    return prefix + stack_generation(stack)


@dataclass(frozen=True)
class DataKeyProps:
    """Props of :class:`DataKey`.

    :param removal_policy: what stack deletion does to the key; RETAIN also lengthens the
        deletion window from 7 to 30 days. Default: DESTROY.
    :param fsx_datasets_bucket: name of the bucket an FSx for Lustre file system links to; the
        key then lets FSx's S3 role use it for that bucket's objects only. Default: None (no
        file system, no FSx statement).
    """

    removal_policy: RemovalPolicy = RemovalPolicy.DESTROY
    fsx_datasets_bucket: str | None = None


class DataKey(kms.Key):
    """The environment's customer-managed key (rotation on), usable by CloudWatch Logs and FSx.

    One key encrypts the buckets, the file system, the flow logs and the training volumes.
    """

    def __init__(self, scope: Construct, construct_id: str, *, props: DataKeyProps | None = None) -> None:
        props = props or DataKeyProps()
        stack = Stack.of(scope)
        super().__init__(
            scope,
            construct_id,
            description=f"Blackwell Training Kit data key ({stack.stack_name})",
            enable_key_rotation=True,
            removal_policy=props.removal_policy,
            pending_window=Duration.days(30 if props.removal_policy == RemovalPolicy.RETAIN else 7),
        )
        self._allow_cloudwatch_logs(stack)
        if props.fsx_datasets_bucket is not None:
            self._allow_fsx_data_repository(stack, props.fsx_datasets_bucket)

    def _allow_cloudwatch_logs(self, stack: Stack) -> None:
        self.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowCloudWatchLogsOfThisAccount",
                principals=[iam.ServicePrincipal(f"logs.{stack.region}.amazonaws.com")],
                actions=["kms:Encrypt", "kms:Decrypt", "kms:ReEncryptFrom", "kms:ReEncryptTo", "kms:GenerateDataKey",
                         "kms:DescribeKey"],
                resources=["*"],
                conditions=account_log_groups_condition(stack),
            )
        )

    def _allow_fsx_data_repository(self, stack: Stack, bucket_name: str) -> None:
        # FSx reads and writes SSE-KMS objects through a per-file-system service-linked role; its
        # name carries the file-system id, unknown before creation, hence the ArnLike pattern. The
        # key policy must name that role itself: the account root would only delegate to IAM, and
        # the service-linked role's own policy grants no KMS. Any principal, narrowed by the role's
        # ARN, this account as caller and S3 as the only path, is AWS's documented pattern for a
        # principal whose ARN is not known yet. S3 names the object (or, with an S3 Bucket Key,
        # the bucket) in the encryption context, so the statement holds for the datasets bucket
        # only, as the FSx for Lustre guide shows for SSE-KMS buckets.
        bucket_arn = f"arn:{stack.partition}:s3:::{bucket_name}"
        self.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowFsxDataRepositoryThroughS3",
                principals=[iam.AnyPrincipal()],
                actions=["kms:Encrypt", "kms:Decrypt", "kms:ReEncryptFrom", "kms:ReEncryptTo", "kms:GenerateDataKey",
                         "kms:DescribeKey"],
                resources=["*"],
                conditions={
                    "ArnLike": {
                        "aws:PrincipalArn": f"arn:{stack.partition}:iam::{stack.account}:{FSX_S3_SERVICE_ROLE}"
                    },
                    "StringEquals": {
                        "kms:ViaService": f"s3.{stack.region}.amazonaws.com",
                        "kms:CallerAccount": stack.account,
                    },
                    "StringLike": {"kms:EncryptionContext:aws:s3:arn": [bucket_arn, f"{bucket_arn}/*"]},
                },
            )
        )
        self.node.default_child.add_metadata(  # type: ignore[union-attr]
            "checkov",
            {"skip": [{"id": "CKV_AWS_33", "comment": "the '*' principal of AllowFsxDataRepositoryThroughS3 is "
                       "narrowed to FSx's S3 service-linked role of this account, via S3 only"}]},
        )


@dataclass(frozen=True)
class DatasetsLocation:
    """The datasets bucket and its prefixes: raw text in, tokenized shards out.

    :param bucket: the datasets bucket.
    :param key: the key its objects are encrypted with.
    :param prefix: where tokenized shards live (the ``s3`` channel, the prefix FSx mirrors).
        Default: ``datasets/``.
    :param raw_prefix: where raw JSONL and ``tokenizer.json`` are put for the tokenize step.
        Default: ``raw/``.
    """

    bucket: s3.IBucket
    key: kms.IKey
    prefix: str = "datasets/"
    raw_prefix: str = "raw/"

    @property
    def shards_s3_url(self) -> str:
        """``s3://<bucket>/<prefix>``: what the ``train`` channel reads in ``s3`` mode."""
        return self.bucket.s3_url_for_object(self.prefix)

    @property
    def raw_s3_url(self) -> str:
        """``s3://<bucket>/<raw_prefix>``: what the tokenize step reads."""
        return self.bucket.s3_url_for_object(self.raw_prefix)

    def grant_prepare(self, grantee: iam.IGrantable) -> iam.Grant:
        """Read raw data and write shards (the tokenize step); idempotent."""
        raw_objects = self.bucket.arn_for_objects(f"{self.raw_prefix}*")
        shard_objects = self.bucket.arn_for_objects(f"{self.prefix}*")
        grant = iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["s3:ListBucket"],
            resource_arns=[self.bucket.bucket_arn],
            conditions={"StringLike": {"s3:prefix": [f"{self.raw_prefix}*"]}},
        )
        for actions, resources in (
            (["s3:GetObject"], [raw_objects]),
            (["s3:PutObject", "s3:AbortMultipartUpload"], [shard_objects]),
            (["kms:Decrypt", "kms:GenerateDataKey"], [self.key.key_arn]),
        ):
            grant = grant.combine(iam.Grant.add_to_principal(grantee=grantee, actions=actions, resource_arns=resources))
        principal = grantee.grant_principal
        policy = principal.node.try_find_child("DefaultPolicy") if isinstance(principal, Construct) else None
        if policy is not None:
            acknowledge_wildcard_resources(
                policy,
                [raw_objects, shard_objects],
                "the tokenize step reads the user's raw files under the raw prefix and writes shards under the "
                "datasets prefix; object keys are the user's data and unknown at deploy time",
            )
        return grant


@dataclass(frozen=True)
class DataStageProps:
    """Props of :class:`DataStage`.

    :param config: the environment's data-stage settings (mode, FSx size, paths).
    :param key: the customer-managed key for buckets and the file system.
    :param vpc: the VPC of the file system (``fsx`` mode).
    :param subnet: the training subnet the file system lives in (``fsx`` mode).
    :param security_group: the EFA/Lustre security group shared with the training jobs.
    :param retain_data: RETAIN the buckets on stack deletion (prod); otherwise DESTROY (a bucket
        that still holds objects then fails to delete: empty it first). The file system is a cache
        of the datasets prefix and is always deleted.
    :param datasets_bucket_name: name of the datasets bucket (``fsx`` mode: the one the key's
        FSx statement names, :func:`datasets_bucket_name`). Default: None (CloudFormation names it).
    """

    config: DataStageConfig
    key: kms.IKey
    vpc: ec2.IVpc
    subnet: ec2.ISubnet
    security_group: ec2.ISecurityGroup
    retain_data: bool = False
    datasets_bucket_name: str | None = None


class DataStage(Construct):
    """Datasets, checkpoints and artifacts buckets, their access logs, and FSx in ``fsx`` mode.

    Attributes: ``key``, ``datasets_bucket``, ``checkpoints_bucket``, ``artifacts_bucket``,
    ``access_log_bucket``, ``datasets_prefix``, ``datasets`` (the bucket and its prefixes, with
    the tokenize grant), and ``file_system``: where jobs read the datasets on FSx for Lustre
    (a :class:`FileSystemLocation`; ``None`` in ``s3`` mode).
    """

    def __init__(self, scope: Construct, construct_id: str, *, props: DataStageProps) -> None:
        super().__init__(scope, construct_id)
        self._validate_props(props)
        # Access logs are delivered through a bucket policy, not the LogDeliveryWrite ACL (ACLs
        # stay disabled on every bucket); set here so the construct does not rely on cdk.json.
        self.node.set_context(ACCESS_LOGS_BY_POLICY, True)
        config = props.config
        self.config = config
        self.key = props.key
        self.removal_policy = data_removal_policy(props.retain_data)
        self.datasets_prefix = config.datasets_prefix

        self.access_log_bucket = s3.Bucket(
            self,
            "AccessLogs",
            # S3 server access logging delivers only to SSE-S3 buckets.
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            versioned=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            removal_policy=self.removal_policy,
            lifecycle_rules=[
                *_lifecycle_rules(),
                s3.LifecycleRule(id="expire-access-logs", expiration=Duration.days(ACCESS_LOG_DAYS)),
            ],
        )
        self.access_log_bucket.node.default_child.add_metadata(  # type: ignore[union-attr]
            "checkov",
            {"skip": [{"id": "CKV_AWS_18", "comment": "server-access-log target bucket; cannot log to itself"}]},
        )
        self.datasets_bucket = self._bucket("Datasets", "datasets/", bucket_name=props.datasets_bucket_name)
        self.checkpoints_bucket = self._bucket("Checkpoints", "checkpoints/")
        if config.checkpoint_expiration_days is not None:
            # SageMaker's checkpoint sync never deletes what training pruned locally. The environment
            # refuses an expiry shorter than its longest execution, retries included
            # (btk.environment.longest_execution_hours): a retry resumes from the first job's checkpoints.
            self.checkpoints_bucket.add_lifecycle_rule(
                id="expire-checkpoints", expiration=Duration.days(config.checkpoint_expiration_days)
            )
        self.artifacts_bucket = self._bucket("Artifacts", "artifacts/")
        self.datasets = DatasetsLocation(bucket=self.datasets_bucket, key=self.key, prefix=self.datasets_prefix)

        self.file_system: FileSystemLocation | None = None
        if config.mode == "fsx":
            self.file_system = self._file_system(props)

    def _validate_props(self, props: DataStageProps) -> None:
        """Every rule a config built without validation could break, each error naming the setting."""
        config = props.config
        try:
            if config.mode == "fsx":
                validate_fsx_settings(config.fsx_storage_capacity_gib, config.fsx_throughput_per_tib)
        except ValueError as error:
            raise ValueError(f"{self.node.path}: {error}") from None

    @property
    def fsx_enabled(self) -> bool:
        """Whether datasets are served from FSx for Lustre (``fsx`` mode)."""
        return self.file_system is not None

    def _bucket(self, construct_id: str, log_prefix: str, bucket_name: str | None = None) -> s3.Bucket:
        return s3.Bucket(
            self,
            construct_id,
            bucket_name=bucket_name,
            encryption=s3.BucketEncryption.KMS,
            encryption_key=self.key,
            bucket_key_enabled=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            versioned=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            server_access_logs_bucket=self.access_log_bucket,
            server_access_logs_prefix=log_prefix,
            removal_policy=self.removal_policy,
            lifecycle_rules=_lifecycle_rules(),
        )

    def _file_system(self, props: DataStageProps) -> FileSystemLocation:
        """FSx for Lustre PERSISTENT_2 linked to the datasets prefix; where jobs find the datasets."""
        config = props.config
        file_system = fsx.LustreFileSystem(
            self,
            "FileSystem",
            vpc=props.vpc,
            vpc_subnet=props.subnet,
            security_group=props.security_group,
            storage_capacity_gib=config.fsx_storage_capacity_gib,
            kms_key=self.key,
            # A cache of the datasets prefix, deleted with the stack even when data is retained:
            # a kept file system would keep the VPC, subnet and security group from being deleted.
            removal_policy=RemovalPolicy.DESTROY,
            file_system_type_version=fsx.FileSystemTypeVersion.V_2_15,
            lustre_configuration=fsx.LustreConfiguration(
                deployment_type=fsx.LustreDeploymentType.PERSISTENT_2,
                per_unit_storage_throughput=config.fsx_throughput_per_tib,
                data_compression_type=fsx.LustreDataCompressionType.LZ4,
            ),
        )
        cfn_file_system = file_system.node.default_child
        assert isinstance(cfn_file_system, fsx.CfnFileSystem)
        cfn_file_system.add_property_override("LustreConfiguration.MetadataConfiguration", {"Mode": "AUTOMATIC"})

        events = list(DRA_EVENTS)
        association = fsx.CfnDataRepositoryAssociation(
            self,
            "DatasetsAssociation",
            file_system_id=file_system.file_system_id,
            file_system_path=config.fsx_directory,
            data_repository_path=f"s3://{self.datasets_bucket.bucket_name}/{config.datasets_prefix}",
            batch_import_meta_data_on_create=True,
            s3=fsx.CfnDataRepositoryAssociation.S3Property(
                auto_import_policy=fsx.CfnDataRepositoryAssociation.AutoImportPolicyProperty(events=events),
                auto_export_policy=fsx.CfnDataRepositoryAssociation.AutoExportPolicyProperty(events=events),
            ),
        )
        association.apply_removal_policy(RemovalPolicy.DESTROY)
        # The file system checks at creation that its security group admits Lustre traffic, and
        # must be gone before those rules are: it depends on each rule the group holds as a
        # resource of its own (rules naming the group itself are not inline).
        for child in props.security_group.node.find_all():
            if isinstance(child, ec2.CfnSecurityGroupIngress | ec2.CfnSecurityGroupEgress):
                file_system.node.add_dependency(child)
        return FileSystemLocation(file_system.file_system_id, file_system.mount_name, config.fsx_directory)

    # -- grants ---------------------------------------------------------------------------

    def grant_read_datasets(self, grantee: iam.IGrantable) -> iam.Grant:
        """Read objects under the datasets prefix (and list that prefix)."""
        self._grant_list(grantee, self.datasets_bucket, self.datasets_prefix)
        self._grant_key(grantee, ["kms:Decrypt"])
        return iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["s3:GetObject"],
            resource_arns=[self.datasets_bucket.arn_for_objects(f"{self.datasets_prefix}*")],
        )

    def grant_read_write_checkpoints(self, grantee: iam.IGrantable) -> iam.Grant:
        """Read, write and delete checkpoint objects (resume, rotation of old checkpoints)."""
        self._grant_list(grantee, self.checkpoints_bucket, None)
        self._grant_key(grantee, ["kms:Decrypt", "kms:GenerateDataKey"])
        return iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                     "s3:ListMultipartUploadParts"],
            resource_arns=[self.checkpoints_bucket.arn_for_objects("*")],
        )

    def grant_write_artifacts(self, grantee: iam.IGrantable) -> iam.Grant:
        """Write model artifacts and job output (multipart uploads need kms:Decrypt).

        ``kms:Encrypt`` too: SageMaker requires it of the execution role when the job's
        ``OutputDataConfig.KmsKeyId`` names a key, as the pipeline's jobs do.
        """
        self._grant_key(grantee, ["kms:Encrypt", "kms:Decrypt", "kms:GenerateDataKey"])
        return iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"],
            resource_arns=[self.artifacts_bucket.arn_for_objects("*")],
        )

    def _grant_list(self, grantee: iam.IGrantable, bucket: s3.IBucket, prefix: str | None) -> None:
        conditions = {"StringLike": {"s3:prefix": [f"{prefix}*"]}} if prefix else None
        iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["s3:ListBucket"],
            resource_arns=[bucket.bucket_arn],
            conditions=conditions,
        )

    def _grant_key(self, grantee: iam.IGrantable, actions: list[str]) -> None:
        iam.Grant.add_to_principal(grantee=grantee, actions=actions, resource_arns=[self.key.key_arn])


def _lifecycle_rules() -> list[s3.LifecycleRule]:
    return [
        s3.LifecycleRule(
            id="abort-incomplete-multipart-uploads",
            abort_incomplete_multipart_upload_after=Duration.days(ABORT_MULTIPART_DAYS),
        ),
        s3.LifecycleRule(
            id="expire-noncurrent-versions",
            noncurrent_version_expiration=Duration.days(NONCURRENT_VERSION_DAYS),
        ),
    ]

