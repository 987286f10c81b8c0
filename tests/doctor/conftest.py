"""Every doctor test runs on the fixture catalog, whatever the user's profiles and environments hold."""

from __future__ import annotations

import fixture_catalog
import pytest
from doctor_fixtures import jobs_of

from btk.doctor import checks


@pytest.fixture(autouse=True)
def _fixture_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    fixture_catalog.install(monkeypatch)


@pytest.fixture(autouse=True)
def _plan_each_environment_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The doctor plans through :func:`doctor_fixtures.jobs_of`: the same planner, once per configuration."""
    monkeypatch.setattr(checks, "planned_jobs", jobs_of)
