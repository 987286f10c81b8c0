"""S3 → FSx for Lustre data stages: the buckets, the key, and the file system in front.

Datasets live in S3 under ``datasets_prefix``; in ``fsx`` mode an FSx for Lustre
PERSISTENT_2 file system in the training subnet mirrors that prefix at ``fsx_directory``
through a data repository association (lazy load on first read, auto import and export of
new, changed and deleted objects). Checkpoints and artifacts go to their own buckets.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import ArnFormat, Duration, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_fsx as fsx
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from btk.environment import FSX_THROUGHPUT_PER_TIB, DataStageConfig

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
    """Raise ``ValueError`` (one line) unless the PERSISTENT_2 size and throughput are sold."""
    if storage_capacity_gib != 1200 and (storage_capacity_gib <= 0 or storage_capacity_gib % 2400):
        raise ValueError(
            f"data_stage.fsx_storage_capacity_gib: {storage_capacity_gib} GiB is not a PERSISTENT_2 size: "
            "use 1200 or a multiple of 2400"
        )
    if throughput_per_tib not in FSX_THROUGHPUT_PER_TIB:
        allowed = ", ".join(map(str, FSX_THROUGHPUT_PER_TIB))
        raise ValueError(
            f"data_stage.fsx_throughput_per_tib: {throughput_per_tib} MB/s/TiB is not offered: use one of {allowed}"
        )


def create_data_key(scope: Construct, construct_id: str, *, removal_policy: RemovalPolicy) -> kms.Key:
    """The environment's customer-managed key (rotation on), usable by CloudWatch Logs.

    One key encrypts the buckets, the file system, the flow logs and the training volumes.
    """
    stack = Stack.of(scope)
    key = kms.Key(
        scope,
        construct_id,
        description=f"Blackwell Training Kit data key ({stack.stack_name})",
        enable_key_rotation=True,
        removal_policy=removal_policy,
        pending_window=Duration.days(30 if removal_policy == RemovalPolicy.RETAIN else 7),
    )
    key.add_to_resource_policy(
        iam.PolicyStatement(
            sid="AllowCloudWatchLogsOfThisAccount",
            principals=[iam.ServicePrincipal(f"logs.{stack.region}.amazonaws.com")],
            actions=["kms:Encrypt", "kms:Decrypt", "kms:ReEncryptFrom", "kms:ReEncryptTo", "kms:GenerateDataKey",
                     "kms:DescribeKey"],
            resources=["*"],
            conditions={
                "ArnLike": {
                    "kms:EncryptionContext:aws:logs:arn": stack.format_arn(
                        service="logs", resource="log-group", resource_name="*",
                        arn_format=ArnFormat.COLON_RESOURCE_NAME,
                    )
                }
            },
        )
    )
    # FSx reads and writes SSE-KMS objects through a per-file-system service-linked role; its
    # name carries the file-system id, unknown before creation, hence the ArnLike pattern. The
    # key policy must name that role itself: the account root would only delegate to IAM, and
    # the service-linked role's own policy grants no KMS. Any principal, narrowed by the role's
    # ARN, this account as caller and S3 as the only path, is AWS's documented pattern for a
    # principal whose ARN is not known yet.
    key.add_to_resource_policy(
        iam.PolicyStatement(
            sid="AllowFsxDataRepositoryThroughS3",
            principals=[iam.AnyPrincipal()],
            actions=["kms:Encrypt", "kms:Decrypt", "kms:ReEncryptFrom", "kms:ReEncryptTo", "kms:GenerateDataKey",
                     "kms:DescribeKey"],
            resources=["*"],
            conditions={
                "ArnLike": {"aws:PrincipalArn": f"arn:{stack.partition}:iam::{stack.account}:{FSX_S3_SERVICE_ROLE}"},
                "StringEquals": {
                    "kms:ViaService": f"s3.{stack.region}.amazonaws.com",
                    "kms:CallerAccount": stack.account,
                },
            },
        )
    )
    key.node.default_child.add_metadata(  # type: ignore[union-attr]
        "checkov",
        {"skip": [{"id": "CKV_AWS_33", "comment": "the '*' principal of AllowFsxDataRepositoryThroughS3 is narrowed "
                   "to FSx's S3 service-linked role of this account, via S3 only"}]},
    )
    return key


@dataclass(frozen=True)
class DataStageProps:
    """Props of :class:`DataStage`.

    :param config: the environment's data-stage settings (mode, FSx size, paths).
    :param key: the customer-managed key for buckets and the file system.
    :param vpc: the VPC of the file system (``fsx`` mode).
    :param subnet: the training subnet the file system lives in (``fsx`` mode).
    :param security_group: the EFA/Lustre security group shared with the training jobs.
    :param retain_data: RETAIN buckets and the file system on stack deletion (prod); otherwise
        DESTROY (a bucket that still holds objects then fails to delete: empty it first).
    """

    config: DataStageConfig
    key: kms.IKey
    vpc: ec2.IVpc
    subnet: ec2.ISubnet
    security_group: ec2.ISecurityGroup
    retain_data: bool = False


class DataStage(Construct):
    """Datasets, checkpoints and artifacts buckets, their access logs, and FSx in ``fsx`` mode.

    Attributes: ``key``, ``datasets_bucket``, ``checkpoints_bucket``, ``artifacts_bucket``,
    ``access_log_bucket``, ``datasets_prefix``; in ``fsx`` mode ``file_system``,
    ``file_system_id``, ``mount_name``, ``directory_path`` (what a SageMaker
    ``FileSystemDataSource`` needs: ``/<mount name><fsx_directory>``) and ``association``;
    these are ``None`` in ``s3`` mode.
    """

    def __init__(self, scope: Construct, construct_id: str, *, props: DataStageProps) -> None:
        super().__init__(scope, construct_id)
        # Access logs are delivered through a bucket policy, not the LogDeliveryWrite ACL (ACLs
        # stay disabled on every bucket); set here so the construct does not rely on cdk.json.
        self.node.set_context(ACCESS_LOGS_BY_POLICY, True)
        config = props.config
        self.config = config
        self.key = props.key
        self.removal_policy = RemovalPolicy.RETAIN if props.retain_data else RemovalPolicy.DESTROY
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
        self.datasets_bucket = self._bucket("Datasets", "datasets/")
        self.checkpoints_bucket = self._bucket("Checkpoints", "checkpoints/")
        if config.checkpoint_expiration_days is not None:
            # SageMaker's checkpoint sync never deletes what training pruned locally.
            self.checkpoints_bucket.add_lifecycle_rule(
                id="expire-checkpoints", expiration=Duration.days(config.checkpoint_expiration_days)
            )
        self.artifacts_bucket = self._bucket("Artifacts", "artifacts/")

        self.file_system: fsx.LustreFileSystem | None = None
        self.association: fsx.CfnDataRepositoryAssociation | None = None
        self.file_system_id: str | None = None
        self.mount_name: str | None = None
        self.directory_path: str | None = None
        if config.mode == "fsx":
            self._file_system(props)

    @property
    def fsx_enabled(self) -> bool:
        """Whether datasets are served from FSx for Lustre (``fsx`` mode)."""
        return self.file_system is not None

    def _bucket(self, construct_id: str, log_prefix: str) -> s3.Bucket:
        return s3.Bucket(
            self,
            construct_id,
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

    def _file_system(self, props: DataStageProps) -> None:
        config = props.config
        try:
            validate_fsx_settings(config.fsx_storage_capacity_gib, config.fsx_throughput_per_tib)
        except ValueError as error:
            raise ValueError(f"{self.node.path}: {error}") from None
        file_system = fsx.LustreFileSystem(
            self,
            "FileSystem",
            vpc=props.vpc,
            vpc_subnet=props.subnet,
            security_group=props.security_group,
            storage_capacity_gib=config.fsx_storage_capacity_gib,
            kms_key=self.key,
            removal_policy=self.removal_policy,
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
        self.file_system = file_system
        self.file_system_id = file_system.file_system_id
        self.mount_name = file_system.mount_name
        self.directory_path = f"/{file_system.mount_name}{config.fsx_directory}"

        events = list(DRA_EVENTS)
        self.association = fsx.CfnDataRepositoryAssociation(
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
        self.association.apply_removal_policy(self.removal_policy)

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

