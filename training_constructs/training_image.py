"""The training image: a Docker image asset built from ``containers/Dockerfile``, or one built elsewhere.

The build context is the repository root, filtered down to what the image installs (the
``btk`` core, the profiles and ``containers/``), so the trainer uses the very same core as
the CDK app without a vendored copy, and the asset hash changes when any of them changes.
Synth only stages those files and hashes them (no Docker needed); ``cdk deploy`` builds the
image for the instance type's CPU (linux/amd64, or linux/arm64 on Grace-based P6e-GB200) and
pushes it to the bootstrap ECR repository. The Dockerfile and the lock serve both: the CUDA base
image is multi-architecture, the EFA installer carries both, and the lock holds every wheel's hash
of each pin (tests/trainer/test_image_pins.py resolves it for both platforms).

Teams with their own image pipeline give an ECR image URI instead (the environment's
``image_uri``): nothing is built, and the execution role may pull from that repository only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aws_cdk import IgnoreMode
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from constructs import Construct

from btk.environment import ECR_IMAGE_URI

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
    :param image_uri: an ECR image built elsewhere (``ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPO:TAG``
        or ``…@sha256:DIGEST``) used instead of building one. Default: ``None`` (build).
    :param cpu_architecture: the training instances' CPU, ``x86_64`` or ``arm64`` (the hardware catalog's
        ``InstanceType.cpu_architecture``). Default: ``x86_64`` (linux/amd64).
    """

    directory: Path = DEFAULT_CONTEXT
    dockerfile: str = DEFAULT_DOCKERFILE
    image_uri: str | None = None
    cpu_architecture: str = "x86_64"


#: The Docker platform of each CPU architecture of the hardware catalog.
PLATFORMS = {"x86_64": ecr_assets.Platform.LINUX_AMD64, "arm64": ecr_assets.Platform.LINUX_ARM64}


class TrainingImage(Construct):
    """A ``DockerImageAsset`` for the training instances' platform, or an image built elsewhere.

    Attributes: ``asset`` (``None`` for an image built elsewhere), ``image_uri``, ``repository``.
    """

    def __init__(self, scope: Construct, construct_id: str, *, props: TrainingImageProps | None = None) -> None:
        super().__init__(scope, construct_id)
        props = props or TrainingImageProps()
        self.asset: ecr_assets.DockerImageAsset | None = None
        self.image_uri: str
        self.repository: ecr.IRepository
        if props.image_uri is not None:
            self.image_uri = props.image_uri
            self.repository = self._repository_of(props.image_uri)
            return
        self._validate_props(props)
        self.asset = ecr_assets.DockerImageAsset(
            self,
            "Asset",
            directory=str(props.directory),
            file=props.dockerfile,
            platform=PLATFORMS[props.cpu_architecture],
            exclude=list(EXCLUDE),
            ignore_mode=IgnoreMode.DOCKER,
        )
        self.image_uri = self.asset.image_uri
        self.repository = self.asset.repository

    def _repository_of(self, image_uri: str) -> ecr.IRepository:
        match = ECR_IMAGE_URI.fullmatch(image_uri)
        if match is None:
            raise ValueError(f"{self.node.path}: image_uri: {image_uri!r} is not an ECR image URI")
        partition = "aws-cn" if ".amazonaws.com.cn/" in image_uri else "aws"
        arn = f"arn:{partition}:ecr:{match['region']}:{match['account']}:repository/{match['repository']}"
        return ecr.Repository.from_repository_attributes(
            self, "Repository", repository_arn=arn, repository_name=match["repository"]
        )

    def _validate_props(self, props: TrainingImageProps) -> None:
        if props.cpu_architecture not in PLATFORMS:
            raise ValueError(
                f"{self.node.path}: cpu_architecture: {props.cpu_architecture!r} is not one of {', '.join(PLATFORMS)}"
            )
        if not (props.directory / props.dockerfile).is_file():
            raise ValueError(
                f"{self.node.path}: dockerfile: no {props.dockerfile} in {props.directory}: add one (see containers/)"
            )

    def grant_pull(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` pull this image (ecr:GetAuthorizationToken is account-wide)."""
        return self.repository.grant_pull(grantee)
