"""The training image: a Docker image asset built from the repository's ``containers/``.

Synth only stages the directory and computes its hash (no Docker needed); ``cdk deploy``
builds the image for linux/amd64 and pushes it to the bootstrap ECR repository.
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from constructs import Construct

#: The image context: ``containers/`` next to ``training_constructs/``.
DEFAULT_CONTEXT = Path(__file__).resolve().parent.parent / "containers"
#: Files that never change the image: kept out of the asset hash so synth stays deterministic.
EXCLUDE = ("**/__pycache__", "**/*.pyc", "**/.pytest_cache", "**/.mypy_cache", "**/.ruff_cache")


class TrainingImage(Construct):
    """A ``DockerImageAsset`` for linux/amd64.

    :param directory: the build context. Default: the repository's ``containers/``.
    :param dockerfile: the Dockerfile inside ``directory``. Default: ``Dockerfile``.

    Attributes: ``asset``, ``image_uri``, ``repository``.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        directory: Path = DEFAULT_CONTEXT,
        dockerfile: str = "Dockerfile",
    ) -> None:
        super().__init__(scope, construct_id)
        if not (directory / dockerfile).is_file():
            raise ValueError(f"training image: no {dockerfile} in {directory}: add one (see containers/)")
        self.asset = ecr_assets.DockerImageAsset(
            self,
            "Asset",
            directory=str(directory),
            file=dockerfile,
            platform=ecr_assets.Platform.LINUX_AMD64,
            exclude=list(EXCLUDE),
        )
        self.image_uri: str = self.asset.image_uri
        self.repository = self.asset.repository

    def grant_pull(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` pull this image (ecr:GetAuthorizationToken is account-wide)."""
        return self.repository.grant_pull(grantee)
