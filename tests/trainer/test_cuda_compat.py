"""CUDA forward compatibility: on exactly when the host driver is older than the image's compat libcuda."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from btk_trainer.cuda_compat import (
    CompatDecision,
    compat_driver_version,
    compat_environment,
    decide,
    host_driver_version,
    node_decision,
    parse_driver_version,
)
from btk_trainer.entrypoint import build_launch, main

FIXTURES = Path(__file__).with_name("fixtures")
ENV = {"BTK_NUM_GPUS": "8"}
COMPAT = Path("/usr/local/cuda/compat")
PROC_570 = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.172.08  Tue Jul  8 18:11:30 UTC 2025\n"


def _compat_dir(tmp_path: Path, version: str | None) -> Path:
    """A compat directory as the cuda-compat package lays it out: libcuda.so.1 -> libcuda.so.<driver>."""
    compat = tmp_path / "compat"
    compat.mkdir()
    if version is not None:
        (compat / f"libcuda.so.{version}").write_bytes(b"")
        (compat / "libcuda.so.1").symlink_to(f"libcuda.so.{version}")
    return compat


@pytest.mark.parametrize(("driver", "compat", "on"), [
    ("570.172.08", "580.95.05", True),     # R570 host, CUDA 13 image: compat needed
    ("535.274.02", "580.95.05", True),
    ("580.95.05", "580.95.05", False),     # the same driver: the host's is as good
    ("580.105.08", "580.95.05", False),    # a newer minor release of the same branch (105 > 95 numerically)
    ("590.44.01", "580.95.05", False),     # a newer branch must never be shadowed by an older libcuda
    ("unknown", "580.95.05", False),       # no NVIDIA driver (CPU, or /proc not mounted)
    ("570.172.08", None, False),           # no compat package in the image
])
def test_decision(driver: str, compat: str | None, on: bool) -> None:
    decision = decide(driver, compat, COMPAT)
    assert decision.use is on and (decision.library_dir == COMPAT) is on
    assert decision.line().startswith(f"btk: cuda compat {'on' if on else 'off'}: ") and "\n" not in decision.line()


def test_reads_the_versions_as_the_driver_and_the_package_write_them(tmp_path: Path) -> None:
    proc = tmp_path / "version"
    proc.write_text(PROC_570)
    assert host_driver_version(proc) == "570.172.08" == parse_driver_version(PROC_570)
    assert host_driver_version(tmp_path / "absent") == "unknown"
    assert compat_driver_version(_compat_dir(tmp_path, "580.95.05")) == "580.95.05"
    assert compat_driver_version(tmp_path / "absent") is None
    decision = node_decision(tmp_path / "compat", proc)
    assert decision.use and decision.library_dir == tmp_path / "compat"


def test_a_plain_file_or_odd_link_is_not_a_compat_library(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "libcuda.so.1").write_bytes(b"")
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "libcuda.so.1").symlink_to("libcuda-custom.so")
    assert compat_driver_version(plain) is None and compat_driver_version(odd) is None


def test_the_compat_directory_goes_first_on_the_library_path_once() -> None:
    on = decide("570.172.08", "580.95.05", COMPAT)
    env = {"LD_LIBRARY_PATH": f"/opt/amazon/ofi-nccl/lib:{COMPAT}:/opt/amazon/efa/lib"}
    assert compat_environment(on, env) == {
        "LD_LIBRARY_PATH": f"{COMPAT}:/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib"}
    assert compat_environment(on, {}) == {"LD_LIBRARY_PATH": str(COMPAT)}
    assert compat_environment(decide("590.44.01", "580.95.05", COMPAT), env) == {}


def test_the_training_processes_get_it_and_the_dry_run_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/amazon/ofi-nccl/lib")
    on = decide("570.172.08", "580.95.05", COMPAT)
    plan = build_launch(FIXTURES / "one_node", ENV, synthetic_data=True, compat=on)
    assert plan.env["LD_LIBRARY_PATH"] == f"{COMPAT}:/opt/amazon/ofi-nccl/lib"
    off = build_launch(FIXTURES / "one_node", ENV, synthetic_data=True, compat=CompatDecision(False, "test"))
    assert "LD_LIBRARY_PATH" not in off.env
    monkeypatch.setattr("btk_trainer.entrypoint.node_decision", lambda: on)
    assert main(["train", "--config-dir", str(FIXTURES / "one_node"), "--synthetic-data", "--dry-run"],
                env=ENV) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["cuda_compat"] == on.line() and printed["env"]["LD_LIBRARY_PATH"].startswith(str(COMPAT))

