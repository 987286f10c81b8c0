"""The training image's Dockerfile: hadolint, and what its build needs of the base image."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "containers" / "Dockerfile"
BASE_USERS = Path(__file__).with_name("fixtures") / "base_images"


def test_hadolint_clean() -> None:
    hadolint = ROOT / ".venv" / "bin" / "hadolint"
    if not hadolint.exists():
        pytest.skip("hadolint not installed (make setup installs it)")
    completed = subprocess.run([str(hadolint), str(DOCKERFILE)], capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stdout + completed.stderr


def _instructions(text: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    return [line.strip() for line in joined.splitlines() if line.strip()]


def _arg_defaults(instructions: list[str]) -> dict[str, str]:
    return dict(match.groups() for line in instructions if (match := re.fullmatch(r"ARG (\w+)=(\S+)", line)))


def _expand(word: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], word)


def _base_release(instructions: list[str], args: dict[str, str]) -> str:
    (image,) = [_expand(line.split()[1], args) for line in instructions if line.startswith("FROM ")]
    match = re.fullmatch(r"nvidia/cuda:[0-9.]+-base-(ubuntu[0-9.]+)", image)
    assert match, f"{image}: the image expects an nvidia/cuda *-base-* image (it carries cuda-compat)"
    return match.group(1)


def _passwd(release: str) -> list[tuple[str, int, int]]:
    path = BASE_USERS / f"{release}.passwd"
    assert path.exists(), f"no users recorded for the base {release}: add its /etc/passwd as {path}"
    return [(name, int(uid), int(gid)) for name, _, uid, gid, *_ in
            (line.split(":") for line in path.read_text().splitlines() if line)]


def _useradds(instructions: list[str], args: dict[str, str]) -> list[tuple[str, int | None]]:
    """Every (name, uid) a RUN line's useradd creates; uid None when useradd picks it."""
    added = []
    for line in instructions:
        if not line.startswith("RUN "):
            continue
        for command in re.findall(r"(?:^|&&|;)\s*(useradd\s[^&;|]*)", line[4:]):
            words = [_expand(word, args) for word in shlex.split(command)]
            uid = None
            for flag in ("--uid", "-u"):
                if flag in words:
                    uid = int(words[words.index(flag) + 1])
            added.append((words[-1], uid))
    return added


def test_the_image_user_takes_no_name_or_id_of_the_base_image() -> None:
    """`useradd --uid 1000` exits 4 on Ubuntu 24.04, whose image holds user `ubuntu` at 1000."""
    instructions = _instructions(DOCKERFILE.read_text())
    args = _arg_defaults(instructions)
    users = _passwd(_base_release(instructions, args))
    added = _useradds(instructions, args)
    assert added, "the Dockerfile adds the btk user"
    names, ids = {name for name, _, _ in users}, {uid for _, uid, _ in users} | {gid for _, _, gid in users}
    for name, uid in added:
        assert name not in names, f"user {name} already exists in the base image"
        assert uid is None or uid not in ids, f"uid {uid} of {name} is taken in the base image"


def test_the_checks_find_a_clash_where_there_is_one() -> None:
    clashing = ('FROM nvidia/cuda:13.0.2-base-ubuntu24.04\n'
                'RUN apt-get update && useradd --create-home --uid 1000 \\\n  btk\n')
    instructions = _instructions(clashing)
    users = _passwd(_base_release(instructions, {}))
    assert _useradds(instructions, {}) == [("btk", 1000)]
    assert 1000 in {uid for _, uid, _ in users}


def test_the_build_fails_without_the_cuda_compat_library() -> None:
    """The entrypoint's forward-compatibility switch needs the base image's cuda-compat package."""
    runs = [line for line in _instructions(DOCKERFILE.read_text()) if line.startswith("RUN ")]
    assert any("readlink /usr/local/cuda/compat/libcuda.so.1" in line for line in runs)
