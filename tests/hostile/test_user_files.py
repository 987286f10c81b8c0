"""Hostile content in the user's own files: generated ``environments.py`` sources and dataset checksum files.

``environments.py`` is Python the user writes; whatever it holds (bytes that are not UTF-8, NUL
bytes, syntax errors, code that raises any exception, a collection of the wrong type), loading
it is its environments or one line that names ``environments.py``. A dataset's
``manifest.json.sha256`` may hold anything a copy or a hand left there: reading the dataset is
its manifest or one line naming the file.

Generated cases per run: 300 ``environments.py`` sources, 300 checksum files.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from example_budget import capped
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from btk import catalog
from btk.errors import BtkError
from btk.shards import MANIFEST_CHECKSUM_NAME, ShardEntry, ShardManifest, read_manifest, write_manifest

GOOD_ENVIRONMENT = (
    "from btk.environment import EnvironmentConfig\n"
    "DEV = EnvironmentConfig(name='dev', availability_zone='us-east-1a', profiles=())\n"
)
SNIPPETS = [
    "ENVIRONMENTS = (DEV,)\nDEFAULT_ENVIRONMENT = 'dev'\n",
    "ENVIRONMENTS = (DEV,)\nDEFAULT_ENVIRONMENT = 'prod'\n",
    "ENVIRONMENTS = 1\n",
    "ENVIRONMENTS = (DEV, DEV)\n",
    "ENVIRONMENTS = (",
    "def f(:\n",
    "import not_a_module_anywhere\n",
    "from btk import not_a_name_there\n",
    "1 / 0\n",
    "raise KeyError('a\\nb')\n",
    "raise ValueError\n",
    "ENVIRONMENTS = (DEV,)\nDEFAULT_ENVIRONMENT = UNDEFINED\n",
    "\x00",
    "\ufeff\ufeff",
    "EnvironmentConfig(name='x')\n",
    "class A:\n    def __getattr__(self, name): raise RuntimeError(name)\nA().x\n",
]
SOURCES = st.one_of(
    st.lists(st.sampled_from(SNIPPETS), min_size=1, max_size=3).map(lambda parts: "".join(parts).encode()),
    st.binary(max_size=80),
    st.text(max_size=80).map(lambda text: text.encode("utf-8", "surrogatepass")),
).map(lambda body: GOOD_ENVIRONMENT.encode() + body)


@pytest.fixture(scope="module")
def user_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A directory first on the Python path, where the generated ``environments.py`` is written."""
    root = tmp_path_factory.mktemp("user")
    saved = sys.modules.pop("environments", None)
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.syspath_prepend(str(root))
        monkeypatch.setattr(sys, "dont_write_bytecode", True)  # each example's file, never a stale .pyc
        yield root
    sys.modules.pop("environments", None)
    if saved is not None:
        sys.modules["environments"] = saved
    catalog.all_environments.cache_clear()


@settings(max_examples=capped(300), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(source=SOURCES)
def test_any_environments_file_loads_or_is_one_line_naming_it(user_root: Path, source: bytes) -> None:
    (user_root / "environments.py").write_bytes(source)
    sys.modules.pop("environments", None)
    importlib.invalidate_caches()
    catalog.all_environments.cache_clear()
    for load in (catalog.all_environments, catalog.default_environment_name):
        try:
            load()
        except BtkError as error:
            message = str(error)
            assert "\n" not in message and message.startswith("environments.py"), message


MANIFEST = ShardManifest(
    dtype="uint16", vocab_size=256, eos_token_id=1, shards=(ShardEntry(file="s.bin", num_tokens=4, sha256="0" * 64),)
)


@settings(max_examples=capped(300), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.one_of(st.binary(max_size=200), st.text(max_size=100).map(str.encode), st.none()))
def test_any_checksum_file_is_the_manifest_or_one_line_naming_it(
    tmp_path_factory: pytest.TempPathFactory, content: bytes | None
) -> None:
    """``None``: the checksum file deleted, which a manifest that names it refuses."""
    directory = tmp_path_factory.mktemp("ds")
    written = write_manifest(directory, MANIFEST)
    sidecar = directory / MANIFEST_CHECKSUM_NAME
    genuine = sidecar.read_bytes()
    if content is None:
        sidecar.unlink()
    else:
        sidecar.write_bytes(content)
    try:
        assert read_manifest(directory) == written
    except BtkError as error:
        message = str(error)
        assert "\n" not in message and MANIFEST_CHECKSUM_NAME in message, message
    else:  # read: only a checksum line that vouches for this very manifest
        assert content is not None and content.split()[:1] in ([genuine.split()[0]], [genuine.split()[0].upper()])
