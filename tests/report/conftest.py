from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import botocore.session
import pytest
from botocore.stub import Stubber

from report_fixtures import REGION


@pytest.fixture
def sagemaker() -> Iterator[tuple[Any, Stubber]]:
    """A real botocore SageMaker client (no credentials needed) wrapped in a Stubber."""
    session = botocore.session.get_session()
    client = session.create_client(
        "sagemaker", region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing"
    )
    with Stubber(client) as stubber:
        yield client, stubber
