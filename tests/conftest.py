"""Settings every test starts from."""

from __future__ import annotations

import gc
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

# Before torch loads (its OpenMP runtime reads this once): one intra-op thread per process. The tests run as many
# processes as cores (pytest-xdist workers, the gloo ranks each test starts, the stages beside them), so more
# threads only oversubscribe the cores and spin waiting for each other (the multi-process trainer tests: 207 CPU-s
# with a thread per core, 183 with one, on 2 cores). A test that wants more threads sets them itself.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest

from btk.evidence import EVIDENCE_ENV
from training_constructs.definition_cache import CACHE_ENV

# Hermetic runs: every synth, in-process or through the CDK CLI, builds its pipeline
# definitions with the SDK and writes nothing under the user's cache. The cache's own tests
# turn it on in a temporary directory.
os.environ[CACHE_ENV] = "off"
# The team's evidence store (btk-evidence.json beside the project, where `btk report --record-evidence` writes)
# is the user's data: no test reads it. A test that wants a store names one (--evidence, or this variable).
os.environ[EVIDENCE_ENV] = str(Path(tempfile.gettempdir()) / f"btk-tests-{os.getpid()}-no-store" / "evidence.json")
# Inductor compiles in the test's own process: its default pool of compile workers (one per core, each importing
# torch) costs more CPU than it saves where the test workers already keep every core busy (the compiled
# activation-memory and parallelize tests: 122 CPU-s with the pool, 105 without, on 2 cores). The generated code is
# the same; subprocesses (torchrun, the workers) inherit the setting.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# Python's cyclic collector: a test process holds a million and more objects that live to its end (the imports of
# torch, the CDK and botocore, the synthesized stacks the fixtures keep), and every full collection walks them all.
# Collections come 14 times less often (the young generation's threshold 10,000 allocations, not 700), and each
# file's survivors are frozen once its tests end (collected first: only what is still reachable is frozen), so a
# later collection walks only what the running file made. A frozen object is still freed when its reference count
# falls to zero; one that later becomes part of an unreachable cycle stays until the process ends (the finished
# file's module fixtures are torn down before the freeze, so what stays is session-long state). The 1,744 tests of
# the planner, CLI, infrastructure, AWS-answer and report folders, two workers on 2 cores: 233 CPU-s user as
# Python sets it, of which the collector 54 in the workers; 179 with both settings. All of `make pytest`: 916 and
# 955 CPU-s user before, 838 after.
gc.set_threshold(10_000, 10, 10)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Slow tests (multi-process torch, full-app synth, the suite re-run on another user's config) first, so
    under `make test`'s parallel run (pytest-xdist, ``--dist loadfile``: a file's tests, and so its
    module-scoped fixtures, stay on one worker) the long files start while the short ones fill the other
    worker, instead of ending the run on one core. The order is the same on every worker (xdist requires
    it): a stable sort."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After a file's last test (its module fixtures torn down), its garbage is collected and what survives is
    frozen (see ``gc.set_threshold`` above)."""
    yield
    if nextitem is None or nextitem.path != item.path:
        gc.collect()
        gc.freeze()
