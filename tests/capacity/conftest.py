"""The ``stubbed_sagemaker`` fixture of the training-plan tests: a Stubber-backed client that records calls."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from capacity_fixtures import REGION, StubbedSageMaker


@pytest.fixture
def stubbed_sagemaker() -> Iterator[StubbedSageMaker]:
    """A real botocore SageMaker client, its Stubber, and the operations it was asked for, in order."""
    client = boto3.client("sagemaker", region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing")
    stubbed = StubbedSageMaker(client=client, stubber=Stubber(client))

    def record(model: Any, **_: Any) -> None:
        stubbed.calls.append(model.name)

    client.meta.events.register("before-parameter-build.sagemaker", record)
    with stubbed.stubber:
        yield stubbed
