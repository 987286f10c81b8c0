"""The deployment environments of this project (edit freely).

Accounts are the documentation account 123456789012: the real ones come from CDK context
(``-c account=...``) or the CI's environment variables, never from this file.
"""

from __future__ import annotations

from btk.environment import DataStageConfig, EnvironmentConfig, OnDemandCapacity

DEV = EnvironmentConfig(
    name="dev",
    region="us-east-1",
    availability_zone="us-east-1a",
    profiles=("llama3.2-1b", "llama3.2-3b"),
    data_stage=DataStageConfig(mode="s3", checkpoint_expiration_days=14),
    capacity=OnDemandCapacity(),
    # Managed spot is not shown to be offered on ml.p6-b200.48xlarge (btk/hardware.py says where
    # that was read); an environment asking for it is refused at synth.
    managed_spot=False,
    retain_data=False,
    log_retention_days=14,
    tags={"project": "blackwell-training-kit", "environment": "dev", "cost-center": "ml-platform"},
)

STAGING = EnvironmentConfig(
    name="staging",
    region="us-east-1",
    availability_zone="us-east-1a",
    profiles=("llama3.2-1b", "llama3.2-3b", "llama3.1-8b"),
    data_stage=DataStageConfig(
        mode="fsx", fsx_storage_capacity_gib=1200, fsx_throughput_per_tib=250, checkpoint_expiration_days=30
    ),
    capacity=OnDemandCapacity(),
    retain_data=False,
    log_retention_days=30,
    vpc_cidr="10.81.0.0/16",
    tags={"project": "blackwell-training-kit", "environment": "staging", "cost-center": "ml-platform"},
)

PROD = EnvironmentConfig(
    name="prod",
    region="us-east-1",
    availability_zone="us-east-1a",
    profiles=("llama3.1-8b", "qwen2.5-14b", "qwen2.5-32b"),
    instance_count=2,
    data_stage=DataStageConfig(mode="fsx", fsx_storage_capacity_gib=4800, fsx_throughput_per_tib=500),
    capacity=OnDemandCapacity(),
    retain_data=True,
    inter_container_encryption=True,
    log_retention_days=365,
    vpc_cidr="10.82.0.0/16",
    tags={"project": "blackwell-training-kit", "environment": "prod", "cost-center": "ml-platform"},
)

ENVIRONMENTS: tuple[EnvironmentConfig, ...] = (DEV, STAGING, PROD)
DEFAULT_ENVIRONMENT = "dev"
