"""Typed deployment environments (dev, staging, prod, ...).

``environments.py`` at the repository root holds the user's instances of
:class:`EnvironmentConfig`. Every value is validated here, before any CDK construct is
built: a bad value fails synth with one line naming the field and the fix.
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from btk.errors import FieldError, UnknownNameError
from btk.hardware import INSTANCE_TYPES, get_instance_type
from btk.naming import TAG_ENVIRONMENT, TAG_INSTANCE_TYPE, TAG_PROFILE
from btk.units import HOURS_PER_DAY, SECONDS_PER_HOUR

DOCUMENTATION_ACCOUNT = "123456789012"
# Use these with ``fullmatch``: ``re.match`` with ``$`` would accept a trailing newline.
ENV_NAME = re.compile(r"[a-z][a-z0-9-]{1,20}")
REGION = re.compile(r"[a-z]{2}(-gov)?-[a-z]+-\d")
#: ``cdk bootstrap --qualifier``: what CDK accepts in its resource names.
BOOTSTRAP_QUALIFIER = re.compile(r"[a-z0-9]{1,10}")
INSTANCE_TYPE = re.compile(r"ml\.[a-z0-9-]+\.[a-z0-9]+")
TRAINING_PLAN_ARN = re.compile(r"arn:aws[a-z-]*:sagemaker:[a-z0-9-]+:\d{12}:training-plan/[a-zA-Z0-9-]{1,63}")
#: Amazon VPC: "The allowed block size is between a /16 netmask (65,536 IP addresses) and /28
#: netmask (16 IP addresses)" (VPC User Guide, "VPC CIDR blocks").
VPC_PREFIX_LONGEST_ALLOWED = 28
VPC_PREFIX_SHORTEST_ALLOWED = 16
#: The training subnet is a /20 (training_constructs/network.py), so the VPC must hold one.
TRAINING_SUBNET_PREFIX = 20
#: AWS tagging rules ("Tagging AWS resources", tag naming limits; CloudFormation's stack ``Tag``,
#: which the stack's tags also become): keys 1-128 characters, values 1-256, letters, numbers
#: and spaces representable in UTF-8 plus ``_ . : / = + - @``; keys starting with ``aws:`` are
#: reserved for AWS; at most 50 tags per resource.
TAG_KEY_MAX = 128
TAG_VALUE_MAX = 256
TAG_SYMBOLS = "_.:/=+-@"
TAG_RESERVED_PREFIX = "aws:"
#: The kit tags every training job itself; the user's tags share the 50-tag limit with them.
KIT_TAG_KEYS = (TAG_ENVIRONMENT, TAG_PROFILE, TAG_INSTANCE_TYPE)
MAX_USER_TAGS = 50 - len(KIT_TAG_KEYS)
#: FSx for Lustre PERSISTENT_2: the one size below 2400 GiB, and the step above it.
FSX_SMALLEST_CAPACITY_GIB = 1200
FSX_CAPACITY_STEP_GIB = 2400
FSX_THROUGHPUT_PER_TIB = (125, 250, 500, 1000)
TRAINING_PLAN_INSTANCE_COUNTS = (1, 2, 4, 8, 16, 32, 64)
TRAINING_PLAN_MAX_DAYS = 182
TRAINING_PLAN_MAX_HOURS = TRAINING_PLAN_MAX_DAYS * HOURS_PER_DAY
#: The retentions CloudWatch Logs accepts, in days (the CDK enum is mapped from this list).
LOG_RETENTION_DAYS = (
    1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653,
)
#: Managed spot: how long a job may wait for capacity plus run, as a multiple of its run time.
SPOT_WAIT_FACTOR = 2
#: SageMaker Pipelines' retry policies: at most 20 attempts (``RetryPolicy.MaxAttempts``).
MAX_RETRY_ATTEMPTS = 20
#: An address SNS can deliver to: one ``@``, a dotted domain, no spaces.
#: An image in an ECR repository (what SageMaker training pulls), by tag or digest; the repository's
#: name rules: https://docs.aws.amazon.com/AmazonECR/latest/APIReference/API_CreateRepository.html
ECR_IMAGE_URI = re.compile(
    r"(?P<account>[0-9]{12})\.dkr\.ecr\.(?P<region>[a-z]{2}(?:-[a-z]+)+-[0-9])\.amazonaws\.com(?:\.cn)?/"
    r"(?P<repository>[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*)"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[0-9a-f]{64})",
    re.ASCII,
)
EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")


def validate_fsx_storage_capacity(gib: int) -> int:
    """``gib`` if PERSISTENT_2 sells that size, else ``ValueError`` (one line)."""
    if gib != FSX_SMALLEST_CAPACITY_GIB and (gib <= 0 or gib % FSX_CAPACITY_STEP_GIB):
        raise ValueError(
            f"{gib} GiB is not a valid PERSISTENT_2 size: use {FSX_SMALLEST_CAPACITY_GIB} or a multiple of "
            f"{FSX_CAPACITY_STEP_GIB}"
        )
    return gib


def validate_fsx_throughput(per_tib: int) -> int:
    """``per_tib`` if PERSISTENT_2 offers that throughput, else ``ValueError`` (one line)."""
    if per_tib not in FSX_THROUGHPUT_PER_TIB:
        allowed = ", ".join(map(str, FSX_THROUGHPUT_PER_TIB))
        raise ValueError(f"{per_tib} MB/s/TiB is not offered for PERSISTENT_2: use one of {allowed}")
    return per_tib


def validate_vpc_cidr(cidr: str) -> str:
    """``cidr`` if it is an IPv4 network a VPC can have and the training subnet fits in, else ``ValueError``."""
    try:
        network = ipaddress.IPv4Network(cidr, strict=True)
    except ValueError as error:
        raise ValueError(f"{cidr!r} is not an IPv4 network like 10.80.0.0/16 ({error})") from None
    if not VPC_PREFIX_SHORTEST_ALLOWED <= network.prefixlen <= VPC_PREFIX_LONGEST_ALLOWED:
        raise ValueError(
            f"{cidr} is a /{network.prefixlen}: a VPC's block is /{VPC_PREFIX_SHORTEST_ALLOWED} to "
            f"/{VPC_PREFIX_LONGEST_ALLOWED}, e.g. 10.80.0.0/16"
        )
    if network.prefixlen > TRAINING_SUBNET_PREFIX:
        raise ValueError(
            f"{cidr} is smaller than the /{TRAINING_SUBNET_PREFIX} training subnet it must hold: use "
            f"/{VPC_PREFIX_SHORTEST_ALLOWED} to /{TRAINING_SUBNET_PREFIX}"
        )
    return cidr


def _tag_text_error(text: str, limit: int) -> str | None:
    """Why ``text`` cannot be a tag key or value under AWS's length and character rules, or ``None``."""
    if not 1 <= len(text) <= limit:
        return f"is {len(text)} characters: use 1 to {limit}"
    odd = sorted({c for c in text if not (c.isalnum() or c in TAG_SYMBOLS or unicodedata.category(c).startswith("Z"))})
    if odd:
        return f"contains {''.join(odd)!r}: use letters, digits, spaces and {TAG_SYMBOLS}"
    return None


def validate_tags(tags: dict[str, str]) -> dict[str, str]:
    """``tags`` if AWS accepts every key and value and the kit's own tags are not among them."""
    if len(tags) > MAX_USER_TAGS:
        raise ValueError(f"{len(tags)} tags: at most {MAX_USER_TAGS} (AWS allows 50, the kit adds {len(KIT_TAG_KEYS)})")
    for key, value in tags.items():
        if key.lower().startswith(TAG_RESERVED_PREFIX):
            raise ValueError(f"key {key!r} starts with {TAG_RESERVED_PREFIX!r}, which AWS reserves for its own tags")
        if key in KIT_TAG_KEYS:
            raise ValueError(f"key {key!r} is set by the kit itself: choose another key")
        problem = _tag_text_error(key, TAG_KEY_MAX)
        if problem:
            raise ValueError(f"key {key!r} {problem}")
        problem = _tag_text_error(value, TAG_VALUE_MAX)
        if problem:
            raise ValueError(f"value of {key!r} {problem}")
    return tags


def is_sellable_plan_duration(hours: int) -> bool:
    """Training plans are sold in whole days, from one day to ``TRAINING_PLAN_MAX_DAYS``."""
    return hours % HOURS_PER_DAY == 0 and 1 <= hours // HOURS_PER_DAY <= TRAINING_PLAN_MAX_DAYS


class DataStageConfig(BaseModel):
    """Where training data lives: FSx for Lustre in front of S3, or S3 FastFile only."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["fsx", "s3"] = "fsx"
    fsx_storage_capacity_gib: int = Field(default=1200, description="1200 or a multiple of 2400")
    fsx_throughput_per_tib: int = Field(default=250, description="PERSISTENT_2: 125, 250, 500 or 1000")
    fsx_directory: str = Field(default="/datasets", description="path inside the file system")
    datasets_prefix: str = Field(default="datasets/", description="S3 prefix linked to FSx")
    checkpoint_expiration_days: int | None = Field(
        default=None,
        ge=1,
        description="delete checkpoint objects this many days after they are written (None: keep). SageMaker "
        "uploads checkpoints but never deletes the ones training pruned locally, so S3 grows without it. It "
        "must outlast the longest execution, retries included (longest_execution_hours)",
    )

    @field_validator("fsx_storage_capacity_gib")
    @classmethod
    def _capacity(cls, value: int) -> int:
        return validate_fsx_storage_capacity(value)

    @field_validator("fsx_throughput_per_tib")
    @classmethod
    def _throughput(cls, value: int) -> int:
        return validate_fsx_throughput(value)

    @field_validator("fsx_directory")
    @classmethod
    def _directory(cls, value: str) -> str:
        if not value.startswith("/") or "//" in value or (value.endswith("/") and value != "/"):
            raise ValueError("must be an absolute path like /datasets (no trailing slash)")
        return value


class OnDemandCapacity(BaseModel):
    """No training plan: jobs run on on-demand (or spot) capacity."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    mode: Literal["on_demand"] = "on_demand"


class ExistingPlanCapacity(BaseModel):
    """A training plan bought outside this stack; verified at deploy time."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    mode: Literal["existing"] = "existing"
    plan_arn: str

    @field_validator("plan_arn")
    @classmethod
    def _arn(cls, value: str) -> str:
        if not TRAINING_PLAN_ARN.fullmatch(value):
            raise ValueError(
                "must be a SageMaker training plan ARN (arn:aws:sagemaker:REGION:ACCOUNT:training-plan/NAME)"
            )
        return value


#: A fee ceiling above a trillion is no ceiling; below 1e16 a float also prints in plain digits
#: (``repr(1e16)`` is ``'1e+16'``, which the purchase guard's decimal field would refuse).
MAX_UPFRONT_FEE = 1e12
#: Training plans launched in 2024; a date outside these years is a typo, not a plan.
MIN_PLAN_YEAR, MAX_PLAN_YEAR = 2024, 2100


class ReservePlanCapacity(BaseModel):
    """Buy a training plan at deploy time, only with explicit approval and a fee ceiling."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    mode: Literal["reserve"] = "reserve"
    start_after: datetime = Field(
        description="earliest start, a fixed date written out (e.g. 2027-01-04T00:00:00Z): the plan's name "
        "derives from it, so a value computed from the clock would buy a new plan on every deploy"
    )
    end_before: datetime | None = Field(
        default=None,
        description="latest end (None: no limit), a fixed date like start_after; at least duration_hours after "
        "start_after",
    )
    duration_hours: int = Field(ge=24)
    instance_count: int
    ultraserver_type: str | None = Field(
        default=None,
        description="for an instance type sold in UltraServers (ml.p6e-gb200.36xlarge): the UltraServer type "
        "to book, e.g. ml.u-p6e-gb200x36; default the largest (btk.hardware); the plan books as many as "
        "instance_count needs",
    )
    max_upfront_fee: float | None = Field(
        default=None,
        gt=0,
        le=MAX_UPFRONT_FEE,
        allow_inf_nan=False,
        description="ceiling in US dollars (offerings in another currency are never bought), finite, up to 1e12",
    )
    purchase_approved: bool = False

    @field_validator("start_after", "end_before")
    @classmethod
    def _fixed_date(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        try:
            value = value.astimezone(UTC)
        except OverflowError:
            raise ValueError(f"{value.isoformat()} is outside the dates a training plan can start or end") from None
        if not MIN_PLAN_YEAR <= value.year <= MAX_PLAN_YEAR:
            raise ValueError(
                f"{value.isoformat()} is outside {MIN_PLAN_YEAR}-{MAX_PLAN_YEAR}: write the plan's real dates"
            )
        if value.second or value.microsecond:
            raise ValueError(
                f"{value.isoformat()} is not a fixed date (it has seconds): write a fixed date such as "
                f"{value:%Y-%m-%d}T00:00:00Z; the plan's name derives from it, so a value computed from the clock "
                "would buy a new plan on every deploy"
            )
        return value

    @model_validator(mode="after")
    def _sellable(self) -> ReservePlanCapacity:
        if self.instance_count not in TRAINING_PLAN_INSTANCE_COUNTS:
            allowed = ", ".join(map(str, TRAINING_PLAN_INSTANCE_COUNTS))
            raise FieldError(
                "instance_count", f"instance_count {self.instance_count} is not sold: use one of {allowed}"
            )
        if not is_sellable_plan_duration(self.duration_hours):
            raise FieldError(
                "duration_hours",
                f"duration_hours {self.duration_hours} must be whole days between 1 and "
                f"{TRAINING_PLAN_MAX_DAYS} ({HOURS_PER_DAY} to {TRAINING_PLAN_MAX_HOURS} hours)",
            )
        if self.max_upfront_fee is None:
            raise FieldError(
                "max_upfront_fee", "max_upfront_fee is required in reserve mode: set the most you will pay"
            )
        if not self.purchase_approved:
            raise FieldError(
                "purchase_approved",
                "purchase_approved must be true in reserve mode: buying a plan charges an up-front fee",
            )
        earliest_end = self.start_after + timedelta(hours=self.duration_hours)
        if self.end_before is not None and self.end_before < earliest_end:
            raise FieldError(
                "end_before",
                f"end_before ({self.end_before.isoformat()}) leaves no room for duration_hours "
                f"({self.duration_hours}) after start_after: make it {earliest_end.isoformat()} or later",
            )
        return self


RETRY_WINDOW_MAX_SECONDS = 14400 * 60
"""A pipeline retry policy expires after at most 14,400 minutes (the SageMaker SDK's
``MAX_EXPIRE_AFTER_MIN``): a longer first wait could never retry."""


class JobRetryConfig(BaseModel):
    """How the pipeline retries a training job that failed for want of capacity or an internal error.

    A retry is a new job of the same pipeline execution: it resumes from that execution's
    checkpoints. The wait before retry *n* is ``interval_seconds x backoff_rate^(n-1)``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_attempts: int = Field(
        default=3, ge=0, le=MAX_RETRY_ATTEMPTS, description="retries after the first job (0: never retry)"
    )
    interval_seconds: int = Field(
        default=600,
        ge=1,
        le=RETRY_WINDOW_MAX_SECONDS,
        description="wait before the first retry (at most 10 days, the longest a retry policy may run)",
    )
    backoff_rate: float = Field(default=2.0, ge=1.0, le=10.0, allow_inf_nan=False, description="growth of the wait")


class RehearsalConfig(BaseModel):
    """A short training job before the long run: the pipeline starts the long run only if it passes.

    It trains the plan's knobs on the fewest nodes that hold them (one where they fit), with the
    environment's data, for ``steps`` optimizer steps: past compilation and the first metric lines,
    so the last metric line (what the gate reads) is a steady-state one. It passes when its
    tokens/s per GPU reach ``min_throughput_share`` of the planner's prediction for it, no step was
    skipped as non-finite, its peak allocated memory per GPU is within the planner's budget for the
    instance type, and (``require_falling_loss``) its loss fell from its first metric line to its
    last; an out-of-memory fails it (after the knob ladder's rungs).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool | None = Field(
        default=None, description="None: on where the environment runs on a training plan, off on demand"
    )
    steps: int = Field(default=50, ge=10, le=1000, description="optimizer steps of the rehearsal job")
    min_throughput_share: float = Field(
        default=0.7, gt=0, le=1.5, allow_inf_nan=False,
        description="the share of the predicted tokens/s per GPU the rehearsal must reach",
    )
    max_runtime_minutes: int = Field(default=120, ge=10, le=24 * 60, description="the rehearsal job's time limit")
    require_falling_loss: bool = Field(
        default=True,
        description="the loss must fall over the rehearsal; turn off for a job that starts from trained weights "
        "(job.init_from), whose loss may not fall measurably in a few dozen steps",
    )


CapacityConfig = Annotated[
    OnDemandCapacity | ExistingPlanCapacity | ReservePlanCapacity,
    Field(discriminator="mode"),
]


class EnvironmentConfig(BaseModel):
    """One deployment environment: where it lives, what it trains, what it may spend."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    account: str = DOCUMENTATION_ACCOUNT
    region: str = "us-east-1"
    availability_zone: str = Field(description="AZ name where the GPUs and FSx live, e.g. us-east-1a")
    profiles: tuple[str, ...] = Field(min_length=1)
    instance_type: str = Field(
        default="ml.p6-b200.48xlarge",
        description="SageMaker training instance type; the planner knows those in btk.hardware",
    )
    instance_count: int = Field(default=1, ge=1, le=64)
    data_stage: DataStageConfig = DataStageConfig()
    capacity: CapacityConfig = OnDemandCapacity()
    rehearsal: RehearsalConfig = RehearsalConfig()
    retain_data: bool = Field(default=False, description="RETAIN buckets, key and FSx on stack delete")
    managed_spot: bool = False
    inter_container_encryption: bool = False
    max_runtime_hours: int = Field(default=72, ge=1, le=28 * 24)
    log_retention_days: int = 30
    vpc_cidr: str = Field(default="10.80.0.0/16", description="IPv4 network of the VPC, /16 to /20")
    tags: dict[str, str] = Field(default_factory=dict, description="AWS tags on every resource of the stack")
    bootstrap_qualifier: str = Field(
        default="",  # filled from the name by _default_qualifier
        validate_default=True,
        description="cdk bootstrap --qualifier of this environment's bootstrap roles, bucket and repository; "
        "default 'btk' + the name without '-', cut to 10 characters (dev: btkdev). Each environment of an "
        "account and region needs its own, so one environment's CI role cannot deploy another",
    )
    image_uri: str | None = Field(
        default=None,
        description="an ECR image built elsewhere (ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPO:TAG or @sha256:DIGEST), "
        "for teams with their own image pipeline; default None builds containers/Dockerfile at cdk deploy",
    )
    job_retries: JobRetryConfig = JobRetryConfig()
    notification_emails: tuple[str, ...] = Field(
        default=(), description="addresses subscribed to the failure topic (each confirms by e-mail)"
    )

    @field_validator("image_uri")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        if value is not None and not ECR_IMAGE_URI.fullmatch(value):
            raise ValueError(
                f"{value!r} is not an ECR image URI like 123456789012.dkr.ecr.us-east-1.amazonaws.com/trainer:v1 "
                "(a tag, or @sha256: and 64 hex digits)"
            )
        return value

    @field_validator("notification_emails")
    @classmethod
    def _emails(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for email in value:
            if not EMAIL.fullmatch(email):
                raise ValueError(f"{email!r} is not an e-mail address like ml-team@example.com")
        if len(set(value)) != len(value):
            raise ValueError("lists an address twice")
        return value

    @model_validator(mode="before")
    @classmethod
    def _default_qualifier(cls, data: object) -> object:
        if isinstance(data, dict) and "bootstrap_qualifier" not in data and isinstance(data.get("name"), str):
            return {**data, "bootstrap_qualifier": default_bootstrap_qualifier(data["name"])}
        return data

    @field_validator("bootstrap_qualifier")
    @classmethod
    def _qualifier(cls, value: str) -> str:
        if not BOOTSTRAP_QUALIFIER.fullmatch(value):
            raise ValueError("must be 1-10 lower-case letters or digits (cdk bootstrap --qualifier), e.g. btkdev")
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not ENV_NAME.fullmatch(value):
            raise ValueError("must be a lower-case slug of 2-21 characters, e.g. dev")
        return value

    @field_validator("account")
    @classmethod
    def _account(cls, value: str) -> str:
        if not re.fullmatch(r"\d{12}", value):
            raise ValueError("must be a 12-digit AWS account id")
        return value

    @field_validator("region")
    @classmethod
    def _region(cls, value: str) -> str:
        if not REGION.fullmatch(value):
            raise ValueError(f"{value!r} is not an AWS region name like us-east-1")
        return value

    @field_validator("instance_type")
    @classmethod
    def _instance_type(cls, value: str) -> str:
        if INSTANCE_TYPE.fullmatch(value):
            return value
        try:
            hint = f"write the SageMaker name {get_instance_type(value).name}"
        except UnknownNameError:
            hint = f"e.g. {', '.join(INSTANCE_TYPES)}"
        raise ValueError(f"{value!r} is not a SageMaker instance type name: {hint}")

    @field_validator("vpc_cidr")
    @classmethod
    def _vpc_cidr(cls, value: str) -> str:
        return validate_vpc_cidr(value)

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: dict[str, str]) -> dict[str, str]:
        return validate_tags(value)

    @field_validator("log_retention_days")
    @classmethod
    def _retention(cls, value: int) -> int:
        if value not in LOG_RETENTION_DAYS:
            raise ValueError(f"{value} is not a CloudWatch Logs retention; use e.g. 7, 30, 90 or 365")
        return value

    @model_validator(mode="after")
    def _az_in_region(self) -> EnvironmentConfig:
        if not re.fullmatch(re.escape(self.region) + r"[a-z]", self.availability_zone):
            raise FieldError(
                "availability_zone",
                f"availability_zone {self.availability_zone!r} is not in region {self.region}: "
                f"use {self.region}a, {self.region}b, ...",
            )
        if len(set(self.profiles)) != len(self.profiles):
            raise FieldError("profiles", "profiles lists a profile twice")
        capacity = self.capacity
        if isinstance(capacity, ExistingPlanCapacity) and f":{self.region}:" not in capacity.plan_arn:
            raise FieldError("capacity.plan_arn", f"capacity.plan_arn is not in region {self.region}")
        if managed_spot_conflict(self):
            raise FieldError("managed_spot", "managed_spot cannot be combined with a training plan (capacity.mode)")
        expiration = self.data_stage.checkpoint_expiration_days
        longest_execution = longest_execution_hours(self)
        if expiration is not None and expiration * HOURS_PER_DAY <= longest_execution:
            raise FieldError(
                "data_stage.checkpoint_expiration_days",
                f"data_stage.checkpoint_expiration_days ({expiration}) must outlast the longest execution "
                f"({longest_execution:.1f} h: {self.job_retries.max_attempts + 1} jobs of up to "
                f"{self.longest_job_hours} h with max_runtime_hours and spot waiting, plus the waits between "
                "retries): raise it or lower "
                "max_runtime_hours or job_retries.max_attempts",
            )
        ultraserver = ultraserver_mismatch(self)
        if ultraserver is not None:
            raise FieldError("capacity.ultraserver_type", ultraserver)
        spot = spot_not_offered(self)
        if spot is not None:
            raise FieldError(
                "managed_spot",
                f"{self.instance_type} is not shown to be offered for managed spot training "
                f"({spot}): set managed_spot=False",
            )
        return self

    @property
    def rehearses(self) -> bool:
        """Whether each pipeline rehearses before its long run (``rehearsal.enabled``; by default where the
        environment runs on a training plan, whose capacity is bought ahead)."""
        if self.rehearsal.enabled is not None:
            return self.rehearsal.enabled
        return not isinstance(self.capacity, OnDemandCapacity)

    @property
    def max_runtime_seconds(self) -> int:
        """SageMaker's ``MaxRuntimeInSeconds`` of every job of the environment."""
        return self.max_runtime_hours * SECONDS_PER_HOUR

    @property
    def max_wait_seconds(self) -> int:
        """SageMaker's ``MaxWaitTimeInSeconds`` of a managed-spot job: waiting for capacity plus running."""
        return SPOT_WAIT_FACTOR * self.max_runtime_seconds

    @property
    def longest_job_hours(self) -> int:
        """How long one job may take from start to end: with managed spot, the wait is included."""
        return self.max_runtime_hours * (SPOT_WAIT_FACTOR if self.managed_spot else 1)

    @property
    def stack_name(self) -> str:
        """CloudFormation stack name; includes the environment."""
        return f"TrainingStack-{self.name}"


def longest_execution_hours(config: EnvironmentConfig) -> float:
    """How long one pipeline execution may keep writing and reading its checkpoints, in hours.

    Every job of the execution (the first and each of ``job_retries.max_attempts`` retries)
    may run, and with managed spot wait, as long as :attr:`EnvironmentConfig.longest_job_hours`;
    retry *n* first waits ``interval_seconds x backoff_rate^(n-1)``. A retry resumes from
    checkpoints the first job wrote, so they must outlive all of it.
    """
    retries = config.job_retries
    waits = sum(retries.interval_seconds * retries.backoff_rate**n for n in range(retries.max_attempts))
    return (retries.max_attempts + 1) * config.longest_job_hours + waits / SECONDS_PER_HOUR


def default_bootstrap_qualifier(name: str) -> str:
    """The bootstrap qualifier of environment ``name`` unless it sets one: ``btk`` + the name, 10 characters at most."""
    # only the characters a qualifier allows: an invalid name is reported once, by its own field
    return ("btk" + "".join(ch for ch in name if ch.isascii() and (ch.islower() or ch.isdigit())))[:10]


def job_log_groups_owner(environments: Sequence[EnvironmentConfig], env: EnvironmentConfig) -> str:
    """The environment that puts SageMaker's account-wide job log groups of ``env``'s account and region
    under its retention and key: the last of ``environments`` there (the one deployed last in CI's order,
    typically prod), or ``env`` itself when it is alone or not in ``environments``.

    Those groups hold every job of the account and region; one environment owns their settings, and the
    others' permissions boundaries refuse to change them.
    """
    sharing = [other.name for other in environments if (other.account, other.region) == (env.account, env.region)]
    return sharing[-1] if env.name in sharing else env.name


def spot_not_offered(config: EnvironmentConfig) -> str | None:
    """Why the environment's managed spot is not offered (the catalog's source), or ``None``.

    Instance types outside the catalog are not judged: nothing is known about them.
    """
    if not config.managed_spot:
        return None
    try:
        offer = get_instance_type(config.instance_type).managed_spot
    except UnknownNameError:
        return None
    return None if offer.offered else offer.source


def ultraserver_mismatch(config: EnvironmentConfig) -> str | None:
    """Why the reserve capacity's ``ultraserver_type`` does not suit the instance type, or ``None``.

    Instance types outside the catalog are not judged, as for spot.
    """
    capacity = config.capacity
    if not isinstance(capacity, ReservePlanCapacity) or capacity.ultraserver_type is None:
        return None
    try:
        instance = get_instance_type(config.instance_type)
    except UnknownNameError:
        return None
    if not instance.ultraservers:
        return (f"{instance.name} is not sold in UltraServers: remove it (only UltraServer instance types such as "
                "ml.p6e-gb200.36xlarge take one)")
    try:
        instance.ultraserver(capacity.ultraserver_type)
    except UnknownNameError as error:
        return str(error)
    return None


def managed_spot_conflict(config: EnvironmentConfig) -> bool:
    """Spot and reserved capacity are mutually exclusive for a SageMaker training job."""
    return config.managed_spot and config.capacity.mode != "on_demand"
