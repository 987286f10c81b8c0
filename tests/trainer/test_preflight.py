"""The network pre-flight's decisions, on CPU with fakes of the probes (no GPU, no EFA here)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

import pytest
from btk_trainer import preflight
from btk_trainer.entrypoint import build_launch, main
from btk_trainer.preflight import (
    PreflightError,
    Transport,
    Versions,
    WorkerResult,
    busbw_gbps,
    efa_devices,
    evaluate,
    parse_driver_version,
    parse_libfabric_version,
    parse_nccl_log,
    preflight_plan,
    run_preflight,
)

from btk.hardware import INSTANCE_TYPES, PREFLIGHT_BUSBW_SAFETY_FACTOR, get_instance_type
from btk.metrics import parse_metric_line

FIXTURES = Path(__file__).with_name("fixtures")
ENV = {"BTK_NUM_GPUS": "8"}
P6 = get_instance_type("ml.p6-b200.48xlarge")
OFI_LOG = [
    "algo-1:123:123 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.20.0",
    "algo-1:123:123 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 8 nics)",
    "algo-1:123:123 [0] NCCL INFO Using network Libfabric",
]
SOCKET_LOG = [
    "algo-1:123:123 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net-ofi.so",
    "algo-1:123:123 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>",
    "algo-1:123:123 [0] NCCL INFO Using network Socket",
]
EIGHT_EFA = [f"rdmap{n}s0" for n in range(8)]


def _result(transport: Transport, busbw: float = 300.0, rank: int = 0) -> WorkerResult:
    return WorkerResult(rank=rank, transport=transport, busbw_gbps=busbw)


def test_parses_what_nccl_and_the_plugin_print() -> None:
    ofi = parse_nccl_log(OFI_LOG)
    assert ofi == Transport(network="Libfabric", provider="efa", plugin_version="1.20.0") and ofi.is_ofi
    socket = parse_nccl_log(SOCKET_LOG)
    assert socket.is_socket and not socket.is_ofi
    assert parse_nccl_log(["NCCL INFO Using network AWS Libfabric"]).is_ofi  # older plugins' name
    assert parse_libfabric_version("fi_info: 2.4.0amzn5.0\nlibfabric: 2.4.0amzn5.0\nlibfabric api: 2.4\n") \
        == "2.4.0amzn5.0"
    assert parse_driver_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Thu Sep 25") \
        == "580.95.05"
    assert parse_libfabric_version("") == parse_driver_version("") == "unknown"


def test_efa_on_an_efa_instance_passes() -> None:
    assert evaluate(P6, 2, EIGHT_EFA, [_result(parse_nccl_log(OFI_LOG), 310.0)]) == 310.0


def test_a_silent_socket_fallback_fails_with_one_line() -> None:
    with pytest.raises(PreflightError, match="fell back to 'Socket' instead of EFA") as error:
        evaluate(P6, 2, EIGHT_EFA, [_result(parse_nccl_log(OFI_LOG)), _result(parse_nccl_log(SOCKET_LOG), rank=9)])
    assert "\n" not in str(error.value) and "rank 9" in str(error.value) and "NCCL_NET_PLUGIN" in str(error.value)


def test_no_efa_device_fails_before_nccl_starts(tmp_path: Path) -> None:
    plan = preflight_plan(["--nnodes=2"], {}, tmp_path, P6, 2)
    started: list[Sequence[str]] = []

    def runner(command: Sequence[str], env: Mapping[str, str], timeout: float) -> int:
        started.append(command)
        return 0

    with pytest.raises(PreflightError, match="no EFA device"):
        run_preflight(plan, runner=runner, devices=lambda: [])
    assert not started


def test_libfabric_on_a_provider_other_than_efa_fails() -> None:
    tcp = Transport(network="Libfabric", provider="tcp")
    with pytest.raises(PreflightError, match="provider 'tcp'"):
        evaluate(P6, 2, EIGHT_EFA, [_result(tcp)])


def test_an_unknown_transport_fails() -> None:
    with pytest.raises(PreflightError, match="no 'Using network' line"):
        evaluate(P6, 2, EIGHT_EFA, [_result(Transport())])


@pytest.mark.parametrize("instance", sorted(INSTANCE_TYPES))
def test_bandwidth_threshold_comes_from_the_catalog(instance: str) -> None:
    catalog = INSTANCE_TYPES[instance]
    minimum = catalog.efa_gbps_per_node.value / 8 * PREFLIGHT_BUSBW_SAFETY_FACTOR
    assert catalog.min_allreduce_busbw_gbps == pytest.approx(minimum) and minimum > 0
    ok = parse_nccl_log(OFI_LOG)
    assert evaluate(catalog, 2, EIGHT_EFA, [_result(ok, minimum * 1.01)]) == pytest.approx(minimum * 1.01)
    with pytest.raises(PreflightError, match=f"below {minimum:.1f} GB/s") as error:
        evaluate(catalog, 2, EIGHT_EFA, [_result(ok, minimum * 2), _result(ok, minimum * 0.5, rank=3)])
    assert "\n" not in str(error.value)


def test_instances_without_catalog_entry_only_measure() -> None:
    assert evaluate(None, 2, [], [_result(parse_nccl_log(SOCKET_LOG), 3.0)]) == 3.0


def test_busbw_formula_matches_nccl_tests() -> None:
    # 16 ranks, 256 MiB in 10 ms: algbw 26.8 GB/s, busbw = algbw * 2 * 15 / 16.
    assert busbw_gbps(256 * 1024**2, 0.01, 16) == pytest.approx(256 * 1024**2 / 0.01 * 30 / 16 / 1e9)
    assert busbw_gbps(1, 0.0, 16) == busbw_gbps(1, 1.0, 1) == 0.0


def test_efa_devices_skips_nvlink_controllers(tmp_path: Path) -> None:
    drivers = tmp_path / "drivers"
    for name in ("efa", "mlx5_core"):
        (drivers / name).mkdir(parents=True)
    infiniband = tmp_path / "infiniband"
    for index in range(10):  # p6-b200: 8 EFA devices and 2 NVLink (mlx5) controllers
        device = infiniband / f"dev{index}" / "device"
        device.mkdir(parents=True)
        (device / "driver").symlink_to(drivers / ("efa" if index < 8 else "mlx5_core"))
    assert efa_devices(infiniband) == [f"dev{index}" for index in range(8)]
    assert efa_devices(tmp_path / "absent") == []


def _fake_workers(results: list[WorkerResult], status: int = 0):  # type: ignore[no-untyped-def]
    def runner(command: Sequence[str], env: Mapping[str, str], timeout: float) -> int:
        result_dir = Path(next(arg for arg in command if arg.startswith("--result-dir=")).split("=", 1)[1])
        for result in results:
            (result_dir / f"preflight_result.{result.rank}.json").write_text(json.dumps(asdict(result)))
        return status
    return runner


def test_run_prints_versions_and_the_metric_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    versions = Versions(driver="580.95.05", cuda="13.0", torch="2.13.0", nccl="2.29.7", libfabric="2.4.0amzn5.0",
                        aws_ofi_nccl="1.20.0")
    results = [WorkerResult(rank=r, transport=parse_nccl_log(OFI_LOG), busbw_gbps=320.0 + r, versions=versions)
               for r in range(2)]
    plan = preflight_plan(["--nnodes=2"], {}, tmp_path, P6, 2)
    (tmp_path / "preflight_result.7.json").write_text("stale")  # an earlier run's file is not read
    assert run_preflight(plan, runner=_fake_workers(results), devices=lambda: EIGHT_EFA) == 320.0
    out = capsys.readouterr().out.splitlines()
    assert "btk: preflight versions driver=580.95.05 cuda=13.0 torch=2.13.0 nccl=2.29.7 " \
           "libfabric=2.4.0amzn5.0 aws_ofi_nccl=1.20.0 efa_devices=8" in out
    assert parse_metric_line(out[-1]) == {"allreduce_busbw_gbps": 320.0}


def test_a_hang_fails_within_the_timeout(tmp_path: Path) -> None:
    plan = preflight_plan(["--nnodes=2"], {}, tmp_path, P6, 2)
    with pytest.raises(PreflightError, match="did not finish in 300 s"):
        run_preflight(plan, runner=_fake_workers([], status=124), devices=lambda: EIGHT_EFA)
    with pytest.raises(PreflightError, match="torchrun exited 1"):
        run_preflight(plan, runner=_fake_workers([], status=1), devices=lambda: EIGHT_EFA)


def test_the_timeout_kills_a_hung_process_group(tmp_path: Path) -> None:
    assert preflight.run_with_timeout(["sleep", "30"], {"PATH": "/usr/bin:/bin"}, 0.5) == 124


# ---------------------------------------------------------------------------- the entrypoint


def _config(tmp_path: Path, instance_type: str | None) -> Path:
    config = tmp_path / "config"
    shutil.copytree(FIXTURES / "four_nodes", config)
    resource = json.loads((config / "resourceconfig.json").read_text())
    if instance_type is None:
        resource.pop("current_instance_type")
    else:
        resource["current_instance_type"] = instance_type
    (config / "resourceconfig.json").write_text(json.dumps(resource))
    return config


def test_multi_node_jobs_plan_a_preflight_and_get_the_catalogs_network_environment(tmp_path: Path) -> None:
    plan = build_launch(_config(tmp_path, "ml.p6-b200.48xlarge"), ENV, synthetic_data=True)
    assert plan.preflight is not None and plan.preflight.instance is P6 and plan.preflight.nnodes == 4
    assert "--master_port=29501" in plan.preflight.command and "--worker" in plan.preflight.command
    assert {key: plan.env[key] for key in P6.network_environment} == P6.network_environment
    single = build_launch(FIXTURES / "one_node", ENV, synthetic_data=True)
    assert single.preflight is None


def test_an_instance_outside_the_catalog_gets_no_efa_settings(tmp_path: Path) -> None:
    plan = build_launch(_config(tmp_path, "ml.g5.48xlarge"), ENV, synthetic_data=True)
    assert plan.preflight is not None and plan.preflight.instance is None
    assert "FI_PROVIDER" not in plan.env


def test_entrypoint_refuses_a_socket_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The trainer never starts: one line on stderr and in the failure file, exit 2."""
    monkeypatch.setattr(preflight.run_preflight, "__kwdefaults__",
                        {"runner": _fake_workers([_result(parse_nccl_log(SOCKET_LOG), 4.0)]),
                         "devices": lambda: EIGHT_EFA, "timeout_s": 300})
    started: list[object] = []
    monkeypatch.setattr("btk_trainer.entrypoint.run", lambda plan: started.append(plan) or 0)
    failure = tmp_path / "failure"
    code = main(["train", "--config-dir", str(_config(tmp_path, "ml.p6-b200.48xlarge")), "--synthetic-data",
                 "--failure-file", str(failure)], env=ENV)
    assert code == 2 and not started
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("btk: error: network pre-flight: NCCL on rank 0 fell back to 'Socket'")
    assert failure.read_text().strip() == err[0]


def test_standalone_on_a_single_node_job_says_it_has_nothing_to_check(capsys: pytest.CaptureFixture[str]) -> None:
    assert preflight.main(["--config-dir", str(FIXTURES / "one_node")], env=ENV) == 0
    assert "preflight skipped" in capsys.readouterr().out
