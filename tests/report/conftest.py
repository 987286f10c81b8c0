from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import fixture_catalog
import pytest
from botocore.stub import Stubber
from report_fixtures import stubbed_client


@pytest.fixture(autouse=True)
def _fixture_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    """The report's profiles and environments are the fixture catalog's, whatever the user's config holds."""
    fixture_catalog.install(monkeypatch)


@pytest.fixture
def sagemaker_and_stubber() -> Iterator[tuple[Any, Stubber]]:
    """A real botocore SageMaker client wrapped in a Stubber (validates params and responses)."""
    client = stubbed_client()
    with Stubber(client) as stubber:
        yield client, stubber
