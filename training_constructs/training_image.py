"""The training image: a Docker image asset built from ``containers/Dockerfile``.

The build context is the repository root, filtered down to what the image installs (the
``btk`` core, the profiles and ``containers/``), so the trainer uses the very same core as
the CDK app without a vendored copy, and the asset hash changes when any of them changes.
Synth only stages those files and hashes them (no Docker needed); ``cdk deploy`` builds the
image for linux/amd64 and pushes it to the bootstrap ECR repository.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aws_cdk import IgnoreMode
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from constructs import Construct

#: The build context: the repository root (filtered by ``EXCLUDE``).
DEFAULT_CONTEXT = Path(__file__).resolve().parent.parent
#: Dockerfile path inside the context.
DEFAULT_DOCKERFILE = "containers/Dockerfile"
#: Docker-style ignore rules: everything but what the Dockerfile copies (mirrors
#: ``containers/Dockerfile.dockerignore``); caches never reach the hash, so synth is deterministic.
EXCLUDE = (
    "*",
    "!btk",
    "!profiles",
    "!containers",
    "containers/bench",
    "containers/.dockerignore",
    "**/__pycache__",
    "**/*.pyc",
    "**/.pytest_cache",
    "**/.mypy_cache",
    "**/.ruff_cache",
)


@dataclass(frozen=True)
class TrainingImageProps:
    """Props of :class:`TrainingImage`.

    :param directory: the build context. Default: the repository root.
    :param dockerfile: the Dockerfile inside ``directory``. Default: ``containers/Dockerfile``.
    """

    directory: Path = DEFAULT_CONTEXT
    dockerfile: str = DEFAULT_DOCKERFILE


class TrainingImage(Construct):
    """A ``DockerImageAsset`` for linux/amd64.

    Attributes: ``asset``, ``image_uri``, ``repository``.
    """

    def __init__(self, scope: Construct, construct_id: str, *, props: TrainingImageProps | None = None) -> None:
        super().__init__(scope, construct_id)
        props = props or TrainingImageProps()
        self._validate_props(props)
        self.asset = ecr_assets.DockerImageAsset(
            self,
            "Asset",
            directory=str(props.directory),
            file=props.dockerfile,
            platform=ecr_assets.Platform.LINUX_AMD64,
            exclude=list(EXCLUDE),
            ignore_mode=IgnoreMode.DOCKER,
        )
        self.image_uri: str = self.asset.image_uri
        self.repository = self.asset.repository

    def _validate_props(self, props: TrainingImageProps) -> None:
        if not (props.directory / props.dockerfile).is_file():
            raise ValueError(
                f"{self.node.path}: dockerfile: no {props.dockerfile} in {props.directory}: add one (see containers/)"
            )

    def grant_pull(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` pull this image (ecr:GetAuthorizationToken is account-wide)."""
        return self.repository.grant_pull(grantee)
