"""The SageMaker entrypoint: torchrun command from fixture configs; malformed jobs fail early."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from btk_trainer.entrypoint import build_launch, main, run

FIXTURES = Path(__file__).with_name("fixtures")
ENV = {"BTK_NUM_GPUS": "8", "SM_MODEL_DIR": "/opt/ml/model"}


def _args(command: list[str]) -> dict[str, str]:
    return dict(arg.removeprefix("--").split("=", 1) for arg in command if arg.startswith("--") and "=" in arg)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    path = tmp_path / "train"
    path.mkdir()
    return path


def test_one_node(data_dir: Path) -> None:
    plan = build_launch(FIXTURES / "one_node", ENV, data_dir=data_dir)
    assert plan.command[:3] == [sys.executable, "-m", "torch.distributed.run"]
    args = _args(plan.command)
    assert args["nnodes"] == "1" and args["node_rank"] == "0" and args["nproc_per_node"] == "8"
    assert args["master_addr"] == "algo-1" and args["master_port"] == "29500"
    assert plan.command[plan.command.index("-m", 3) + 1] == "btk_trainer.train"
    assert args["hyperparameters"] == str(FIXTURES / "one_node" / "hyperparameters.json")
    assert args["data-dir"] == str(data_dir) and args["model-dir"] == "/opt/ml/model"
    assert args["checkpoint-dir"] == "/opt/ml/checkpoints"
    assert args["failure-file"] == "/opt/ml/output/failure"  # the trainer's own one-line errors land there too
    assert plan.env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert plan.spec.knobs.precision == "fp8_tensorwise" and plan.spec.knobs.tensor_parallel == 2


def test_four_nodes_rank_from_sorted_hosts(data_dir: Path) -> None:
    plan = build_launch(FIXTURES / "four_nodes", ENV, data_dir=data_dir, master_port=29600)
    args = _args(plan.command)
    # hosts are listed out of order in the fixture; algo-3 is third once sorted.
    assert args["nnodes"] == "4" and args["node_rank"] == "2" and args["nproc_per_node"] == "8"
    assert args["master_addr"] == "algo-1" and args["master_port"] == "29600"
    assert plan.env["NCCL_SOCKET_IFNAME"] == "ens32"


def test_dry_run_prints_command(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["train", "--config-dir", str(FIXTURES / "four_nodes"), "--data-dir", str(data_dir), "--dry-run"],
                env=ENV)
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert "--node_rank=2" in printed["command"]


def _copy(tmp_path: Path, **changes: object) -> Path:
    config = tmp_path / "config"
    shutil.copytree(FIXTURES / "four_nodes", config)
    hyperparameters = json.loads((config / "hyperparameters.json").read_text())
    for key, value in changes.items():
        if value is None:
            hyperparameters.pop(key, None)
        else:
            hyperparameters[key] = value
    (config / "hyperparameters.json").write_text(json.dumps(hyperparameters))
    return config


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"precision": "fp4"}, "precision"),
        ({"micro_batch_size": "zero"}, "micro_batch_size"),
        ({"arch.hidden_size": None}, "arch.hidden_size"),
        ({"tensor_parallel": "3"}, "tensor_parallel"),
        ({"job.checkpoint_interval_steps": "0"}, "job.checkpoint_interval_steps"),
        # the one precision x tensor-parallel rule (btk.knobs), refused before torchrun starts
        ({"precision": "mxfp8"}, "precision mxfp8 with tensor_parallel 2"),
        ({"precision": "fp8_rowwise"}, "precision fp8_rowwise with tensor_parallel 2"),
    ],
)
def test_malformed_hyperparameters_fail_with_one_line(
    tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, object], expected: str
) -> None:
    config = _copy(tmp_path, **changes)
    failure = tmp_path / "failure"
    code = main(["train", "--config-dir", str(config), "--data-dir", str(data_dir), "--failure-file", str(failure)],
                env=ENV)
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("btk: error:") and expected in err
    assert failure.read_text() == err


def test_layout_and_config_errors(tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _copy(tmp_path, tensor_parallel="8", sharding="hybrid_shard")
    assert main(["--config-dir", str(config), "--data-dir", str(data_dir), "--failure-file", str(tmp_path / "f")],
                env={"BTK_NUM_GPUS": "4"}) == 2
    assert "tensor_parallel=8 must divide" in capsys.readouterr().err
    assert main(["--config-dir", str(tmp_path / "missing"), "--failure-file", str(tmp_path / "f")], env=ENV) == 2
    assert "resourceconfig.json" in capsys.readouterr().err
    assert main(["--config-dir", str(FIXTURES / "one_node"), "--data-dir", str(tmp_path / "nope"),
                 "--failure-file", str(tmp_path / "f")], env=ENV) == 2
    assert "training data channel" in capsys.readouterr().err
    (config / "resourceconfig.json").write_text('{"hosts": ["algo-1"], "current_host": "algo-9"}')
    assert main(["--config-dir", str(config), "--failure-file", str(tmp_path / "f")], env=ENV) == 2
    assert "current_host 'algo-9' is not in hosts" in capsys.readouterr().err


def test_quoted_values_are_accepted(tmp_path: Path, data_dir: Path) -> None:
    config = _copy(tmp_path, precision='"bf16"', micro_batch_size='"2"')
    plan = build_launch(config, ENV, data_dir=data_dir)
    assert plan.spec.knobs.precision == "bf16" and plan.spec.knobs.micro_batch_size == 2


def test_malformed_job_exits_before_importing_torch(tmp_path: Path, data_dir: Path) -> None:
    """As a process: exit 2, one stderr line, and torch never imported (so no GPU touched)."""
    config = _copy(tmp_path, precision="fp4")
    # A fresh interpreter, outside pytest: its pythonpath setting does not reach it.
    probe = (
        "import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]];"
        "from btk_trainer.entrypoint import main; code = main(sys.argv[3:]);"
        "assert 'torch' not in sys.modules; raise SystemExit(code)"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe, str(Path(__file__).parents[2] / "containers"), str(Path(__file__).parents[2]),
         "train", "--config-dir", str(config), "--data-dir", str(data_dir), "--failure-file", str(tmp_path / "f")],
        capture_output=True, text=True, env={"BTK_NUM_GPUS": "8", "PATH": "/usr/bin:/bin"}, check=False, timeout=120,
    )
    assert completed.returncode == 2, completed.stderr
    assert completed.stderr.strip().count("\n") == 0 and "precision" in completed.stderr


def test_trainer_writes_its_error_to_the_failure_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An error found inside the trainer (here: bad hyperparameters) becomes SageMaker's failure reason."""
    from btk_trainer.train import main as train_main

    config = _copy(tmp_path, micro_batch_size="-1")
    failure = tmp_path / "out" / "failure"
    code = train_main(["--hyperparameters", str(config / "hyperparameters.json"), "--failure-file", str(failure)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "micro_batch_size" in err
    assert failure.read_text() == err


@pytest.mark.parametrize(
    ("script", "status"),
    [
        ("raise SystemExit(0)", 0),
        ("raise SystemExit(1)", 1),  # torchrun's status when a training process failed
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 128 + 9),  # killed: as a shell reports it
    ],
)
def test_run_returns_the_launchers_exit_status(data_dir: Path, script: str, status: int) -> None:
    import dataclasses
    import signal

    plan = dataclasses.replace(build_launch(FIXTURES / "one_node", ENV, data_dir=data_dir),
                               command=[sys.executable, "-c", script])
    before = signal.getsignal(signal.SIGTERM)
    assert run(plan) == status
    assert signal.getsignal(signal.SIGTERM) is before  # the forwarding handler is removed again


def test_main_exits_with_the_launchers_status(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import btk_trainer.entrypoint as entrypoint

    monkeypatch.setattr(entrypoint, "run", lambda plan: 143)
    assert main(["train", "--config-dir", str(FIXTURES / "one_node"), "--data-dir", str(data_dir)], env=ENV) == 143


@pytest.mark.parametrize(
    "content",
    [b'{"a": "\xff"}', b"[" * 50_000 + b"]" * 50_000, b'{"seed": ' + b"7" * 5000 + b"}", b'{"a": '],
    ids=["invalid UTF-8", "deep nesting", "5000-digit integer", "truncated"],
)
def test_hostile_hyperparameters_file_is_one_line_before_torchrun(
    tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    config = _copy(tmp_path)
    (config / "hyperparameters.json").write_bytes(content)
    failure = tmp_path / "failure"
    code = main(["train", "--config-dir", str(config), "--data-dir", str(data_dir), "--failure-file", str(failure)],
                env=ENV)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "hyperparameters.json" in err


def test_the_launchers_import_one_way() -> None:
    """entrypoint -> preflight -> launch, and nothing back: no module of the trainer imports the entrypoint."""
    import ast

    package = Path(__file__).resolve().parents[2] / "containers" / "btk_trainer"

    def imported(module: str) -> set[str]:
        tree = ast.parse((package / f"{module}.py").read_text())
        names = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        names |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        return {name.removeprefix("btk_trainer.") for name in names if name.startswith("btk_trainer")}

    assert "entrypoint" not in set().union(*(imported(path.stem) for path in package.glob("*.py")))
    assert imported("launch") <= {"cuda_compat"} and "entrypoint" not in imported("preflight")


@pytest.mark.parametrize(("job_value", "expected"), [(None, "8"), ("24", "24")])
def test_training_processes_get_eight_cpu_threads_unless_the_job_sets_them(
        data_dir: Path, job_value: str | None, expected: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun alone would give each process one thread (it sets OMP_NUM_THREADS=1 where unset); the job's own
    value stands. Gloo's bootstrap uses the job's interface, as NCCL's does."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the suite's own setting (tests/conftest.py)
    env = ENV if job_value is None else {**ENV, "OMP_NUM_THREADS": job_value}
    plan = build_launch(FIXTURES / "one_node", env, data_dir=data_dir)
    assert plan.env["OMP_NUM_THREADS"] == expected
    assert plan.env["GLOO_SOCKET_IFNAME"] == plan.env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert plan.env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
