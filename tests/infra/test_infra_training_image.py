"""The training image asset of the real TrainingStack, for every environment.

The image asset stages the repository root filtered to ``btk/``, ``profiles/`` and
``containers/``: nothing else reaches the build context or the asset hash.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from stack_synth import REPO, Synth

from training_constructs.training_image import DEFAULT_DOCKERFILE, EXCLUDE

BUILD_INPUTS = ("btk", "profiles", "containers")


def _staged_files(synth: Synth) -> set[str]:
    assets = json.loads((synth.outdir / f"{synth.stack.artifact_id}.assets.json").read_text())
    (image,) = assets["dockerImages"].values()
    staged = synth.outdir / image["source"]["directory"]
    assert image["source"]["dockerFile"] == DEFAULT_DOCKERFILE
    return {path.relative_to(staged).as_posix() for path in staged.rglob("*") if path.is_file()}


def test_image_asset_stages_only_btk_profiles_and_containers(synth: Synth) -> None:
    files = _staged_files(synth)
    assert DEFAULT_DOCKERFILE in files
    assert {name.split("/", 1)[0] for name in files} == set(BUILD_INPUTS)
    for name in files:
        parts = name.split("/")
        assert "__pycache__" not in parts and not name.endswith(".pyc"), name
        assert not any(part.endswith("_cache") for part in parts), name
        assert not name.startswith("containers/bench/"), name
    assert "btk/knobs.py" in files and "btk/metrics.py" in files  # the core the trainer imports


def test_image_asset_holds_every_tracked_build_input(synth: Synth) -> None:
    """Every committed file of the build inputs is in the context, but for the paths EXCLUDE names."""
    listing = subprocess.run(["git", "ls-files", "--", *BUILD_INPUTS], cwd=REPO, capture_output=True, text=True,
                             check=False)
    if listing.returncode != 0:
        pytest.skip("not a git checkout")
    named = [rule for rule in EXCLUDE if not rule.startswith("!") and "*" not in rule]
    assert "containers/bench" in named
    tracked = {name for name in listing.stdout.splitlines()
               if not any(name == rule or name.startswith(f"{rule}/") for rule in named) and (REPO / name).is_file()}
    assert tracked
    missing = sorted(tracked - _staged_files(synth))
    assert not missing, missing[:10]
