"""Fixtures for the infrastructure tests: each environment is synthesized once per session."""

from __future__ import annotations

import pytest
from infra_fixtures import ENV_NAMES, Synth, synthesize


@pytest.fixture(scope="session")
def synths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Synth]:
    return {name: synthesize(name, tmp_path_factory.mktemp(f"cdk-{name}")) for name in ENV_NAMES}


@pytest.fixture(params=ENV_NAMES)
def synth(request: pytest.FixtureRequest, synths: dict[str, Synth]) -> Synth:
    return synths[request.param]
