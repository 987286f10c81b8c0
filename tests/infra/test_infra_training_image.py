"""The training image asset of the real TrainingStack, for every environment.

The image asset stages the repository root filtered to ``btk/``, ``profiles/`` and
``containers/``: nothing else reaches the build context or the asset hash.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from stack_synth import REPO, Synth, cli_app

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
        # the build inputs are what git tracks; a copy without .git (the workflow tests run the
        # suite on one) has no such list, and the clone CI runs always has it
        pytest.skip("not a git checkout")
    named = [rule for rule in EXCLUDE if not rule.startswith("!") and "*" not in rule]
    assert "containers/bench" in named
    tracked = {name for name in listing.stdout.splitlines()
               if not any(name == rule or name.startswith(f"{rule}/") for rule in named) and (REPO / name).is_file()}
    assert tracked
    missing = sorted(tracked - _staged_files(synth))
    assert not missing, missing[:10]


def _asset_hash(context: Path, outdir: Path) -> str:
    """Synthesize a stack holding only a TrainingImage built from ``context``; its asset hash."""
    from aws_cdk import Stack

    from training_constructs.training_image import TrainingImage, TrainingImageProps

    # A stack of an asset alone has no resources, which the CLI's template validation refuses; only the
    # asset's hash is read here.
    app = cli_app(outdir=str(outdir), context={"@aws-cdk/core:validateAgainstDefaultRules": False})
    stack = Stack(app, "ImageOnly")
    TrainingImage(stack, "Image", props=TrainingImageProps(directory=context))
    assembly = app.synth()
    assets = json.loads((Path(assembly.directory) / f"{stack.artifact_id}.assets.json").read_text())
    (asset_hash,) = assets["dockerImages"]
    return str(asset_hash)


def test_asset_hash_ignores_files_outside_the_build_context(tmp_path: Path) -> None:
    """Only a change to what the image installs makes a new image: docs, tests, the CDK app and
    caches inside the context leave the hash (and so the deploy's image build) alone."""
    context = tmp_path / "repo"
    for name in BUILD_INPUTS:
        shutil.copytree(REPO / name, context / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*_cache", "bench"))
    (context / "README.md").write_text("one\n")
    (context / "docs").mkdir()
    (context / "docs" / "trainer.md").write_text("one\n")
    first = _asset_hash(context, tmp_path / "out1")

    (context / "README.md").write_text("two\n")
    (context / "docs" / "trainer.md").write_text("two\n")
    (context / "app.py").write_text("# unrelated\n")
    cache = context / "btk" / "__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "knobs.cpython-312.pyc").write_bytes(b"\0")
    (context / "containers" / "bench").mkdir(exist_ok=True)
    (context / "containers" / "bench" / "run.sh").write_text("echo\n")
    assert _asset_hash(context, tmp_path / "out2") == first

    (context / "containers" / "btk_trainer" / "entrypoint.py").write_text("# changed\n")
    changed = _asset_hash(context, tmp_path / "out3")
    assert changed != first
    (context / "containers" / "requirements.lock").write_text("# changed\n")
    assert _asset_hash(context, tmp_path / "out4") not in {first, changed}


def test_context_filter_and_dockerignore_allow_the_same_files() -> None:
    """BuildKit (containers/Dockerfile.dockerignore) and the CDK asset (EXCLUDE) see the same inputs:
    every path the Dockerfile copies is allowed by both."""
    dockerfile = (REPO / DEFAULT_DOCKERFILE).read_text()
    copied = [line.split()[1] for line in dockerfile.splitlines() if line.startswith("COPY ")]
    ignore = (REPO / "containers" / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = [rule[1:].rstrip("/") for rule in ignore if rule.startswith("!")]
    for path in copied:
        assert (REPO / path).exists(), path
        assert any(path == rule or path.startswith(f"{rule}/") for rule in allowed), path
        assert path.split("/")[0] in BUILD_INPUTS


def test_an_image_built_elsewhere_is_pulled_from_its_repository_and_nothing_is_built(tmp_path: Path) -> None:
    """``image_uri`` (or ``-c image_uri=``): no Docker asset in the cloud assembly, the URI in the stack's output,
    and the execution role may pull from that repository alone."""
    from reserve_variant import synthesize_environment

    import environments

    uri = "123456789012.dkr.ecr.us-east-1.amazonaws.com/ml/trainer@sha256:" + "0" * 64
    env = environments.ENVIRONMENTS[0].model_copy(update={"image_uri": uri})
    template = synthesize_environment(env, tmp_path)
    manifests = [json.loads(path.read_text()) for path in tmp_path.glob("*.assets.json")]
    assert manifests and all(manifest.get("dockerImages", {}) == {} for manifest in manifests)
    assert template["Outputs"]["ImageUri"]["Value"] == uri
    pulls = [statement for resource in template["Resources"].values() if resource["Type"] == "AWS::IAM::Policy"
             for statement in resource["Properties"]["PolicyDocument"]["Statement"]
             if "ecr:BatchGetImage" in statement["Action"]]
    assert [statement["Resource"] for statement in pulls] == [
        "arn:aws:ecr:us-east-1:123456789012:repository/ml/trainer"]
