"""Settings every test starts from."""

from __future__ import annotations

import os

from training_constructs.definition_cache import CACHE_ENV

# Hermetic runs: every synth, in-process or through the CDK CLI, builds its pipeline
# definitions with the SDK and writes nothing under the user's cache. The cache's own tests
# turn it on in a temporary directory.
os.environ[CACHE_ENV] = "off"
