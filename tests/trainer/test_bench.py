"""The GPU benchmark and its one-call H200 script, run on CPU with a toy architecture.

The script's dry runs use profiles of the user's catalog (``BENCH_PROFILES``: with ``--tiny``
only their names and training intent matter); the in-process checks use the fixture catalog
(``tests/fixture_catalog.py``). ``BTK_BENCH_PYTHON`` runs the script's dry runs under another
interpreter, e.g. one with the H200 machine's torch 2.11 and without pydantic, with
``BTK_BENCH_WHEELS=.whl`` so the script installs the fetched wheels as it does there.
"""

from __future__ import annotations

import ast
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import weakref
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import fixture_catalog as fc
import pytest
import torch
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from btk.catalog import all_profiles

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "containers" / "bench"
RUN_H200 = BENCH / "run_h200.sh"
BENCH_PYTHON = os.environ.get("BTK_BENCH_PYTHON", sys.executable)
#: What nvidia-smi says on a machine the test makes up: the report must carry what it reads at run time.
FAKE_DRIVER = "580.159.04"
#: A toy run on CPU, short steps.
TOY_RUN = ("--device", "cpu", "--tiny", "--seq-len", "32", "--set", "micro_batch_size=2", "--warmup", "1",
           "--steps", "2")
#: Runs the benchmark with btk.catalog pointed at the fixture profiles.
WITH_FIXTURE_PROFILES = (
    "import sys; import fixture_catalog as fc; from btk import catalog; "
    "catalog.all_profiles = lambda: dict(fc.PROFILES); "
    "from btk_trainer.bench import main; raise SystemExit(main(sys.argv[1:]))"
)


@pytest.fixture
def fixture_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    from btk import catalog

    monkeypatch.setattr(catalog, "all_profiles", lambda: dict(fc.PROFILES))


def _two_user_profiles() -> list[str]:
    names = sorted(all_profiles())
    if len(names) < 2:
        pytest.skip("the dry runs train two profiles of profiles/; this catalog has fewer")
    return names[:2]


def _run_script(tmp_path: Path, *args: str, cases: str = "--precision bf16",
                profiles: list[str] | None = None) -> tuple[subprocess.CompletedProcess[str], Path]:
    """run_h200.sh as the lent machine runs it, on CPU, with an ``nvidia-smi`` that reports :data:`FAKE_DRIVER`."""
    out, fake_bin = tmp_path / "out", tmp_path / "bin"
    fake_bin.mkdir()
    nvidia_smi = fake_bin / "nvidia-smi"
    nvidia_smi.write_text(f"#!/bin/sh\necho {FAKE_DRIVER}\n")
    nvidia_smi.chmod(0o755)
    completed = subprocess.run(
        ["bash", str(RUN_H200), *TOY_RUN, *args],
        capture_output=True, text=True, timeout=600, check=False,
        env={"OUT": str(out), "WHEELS": os.environ.get("BTK_BENCH_WHEELS", str(tmp_path / "no-wheels")),
             "SITE": str(tmp_path / "site"), "PYTHON": BENCH_PYTHON, "PATH": f"{fake_bin}:/usr/bin:/bin",
             "OMP_NUM_THREADS": "2", "BENCH_PROFILES": " ".join(profiles or _two_user_profiles()),
             "BENCH_CASES": cases},
    )
    return completed, out


def _interpreter_versions() -> dict[str, str | None]:
    """torch's and Python's versions as the benchmark's interpreter reports them itself."""
    if sys.executable == BENCH_PYTHON:
        return {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}
    completed = subprocess.run(
        [BENCH_PYTHON, "-c", "import json, platform, torch; print(json.dumps({'torch': torch.__version__, "
         "'cuda': torch.version.cuda, 'python': platform.python_version()}))"],
        capture_output=True, text=True, timeout=120, check=True)
    versions: dict[str, str | None] = json.loads(completed.stdout.splitlines()[-1])
    return versions


def _cases(out: Path) -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = json.loads((out / "results.json").read_text())["cases"]
    return cases


def test_dry_run_prints_its_plan_first_labels_versions_and_survives_failures(tmp_path: Path) -> None:
    """The exact script of the H200 call on CPU: the expected minutes come before any training; a failure
    in the second case and one in the first case's phase run leave every other figure standing."""
    completed, out = _run_script(tmp_path, "--inject-failure", "2:throughput", "--inject-failure", "1:phases")
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "bench exit status: 0" in completed.stdout
    log = (out / "bench.log").read_text()
    plan_end = log.index("btk-bench: expected total ")
    assert "btk_metric" not in log[:plan_end]  # the plan is printed before anything trains
    minutes = re.findall(r"btk-bench: {3}case (\d) .*: (\d+\.\d) min \(throughput", log[:plan_end])
    assert [number for number, _ in minutes] == ["1", "2"] and all(float(m) > 0 for _, m in minutes)
    assert "ESTIMATES" in log[:plan_end]

    first, second = _cases(out)
    assert first["status"] == "measured" and first["measured"]["tokens_per_second_per_gpu"] > 0
    assert 0 < first["measured"]["first_step_seconds"] < first["runs"]["throughput"]["wall_seconds"]  # measured
    assert "injected failure (--inject-failure 1:phases)" in first["measured"]["phases_error"]
    communication = first["measured"]["communication_seconds_per_step"]  # the run after the failed one ran
    assert 0 <= communication["exposed"] <= communication["total"] < 5e-3  # 1 process: all-reduces over one rank
    assert {kind: run["status"] for kind, run in first["runs"].items()} == {
        "throughput": "done", "phases": "failed", "communication": "done"}
    assert all(run["estimated_seconds"] > 0 and run["wall_seconds"] > 0 for run in first["runs"].values())
    assert second["status"] == "failed" and "measured" not in second
    assert "injected failure (--inject-failure 2:throughput)" in second["error"]
    assert (out / "bench.log").read_text().count("btk_metric step=") >= 3  # case 1: 1 warm-up + 2 timed steps

    report = json.loads((out / "results.json").read_text())
    assert report["complete"] is True
    versions = _interpreter_versions()
    assert {key: report["environment"][key] for key in versions} == versions
    assert report["environment"]["driver"] == FAKE_DRIVER
    header = (out / "performance.md").read_text().splitlines()[0]
    assert f"NVIDIA driver {FAKE_DRIVER}" in header and f"torch {versions['torch']} (CUDA " in header
    assert f"Python {versions['python']}" in header


def test_dry_run_killed_in_its_second_case_keeps_the_first_cases_figures(tmp_path: Path) -> None:
    """SIGKILL in the second case (as an out-of-memory kill or a hard timeout): the files hold case 1, whole."""
    completed, out = _run_script(tmp_path, "--no-phases", "--inject-failure", "2:kill")
    assert completed.returncode == 128 + 9, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert f"bench exit status: {128 + 9}" in completed.stdout
    report = json.loads((out / "results.json").read_text())
    assert report["complete"] is False
    first, second = report["cases"]
    assert first["status"] == "measured" and first["measured"]["tokens_per_second_per_gpu"] > 0
    assert set(first["runs"]) == {"throughput"}  # --no-phases
    assert second["status"] == "pending" and second["runs"]["throughput"]["status"] == "pending"
    table = (out / "performance.md").read_text()
    assert "INCOMPLETE" in table
    assert f"{first['measured']['tokens_per_second_per_gpu']:,.0f}" in table
    assert sorted(path.name for path in out.iterdir()) == ["bench.log", "env.txt", "performance.md", "results.json"]


def _planned_runs(out: Path) -> list[str]:
    """The arguments run_h200.sh passes to the benchmark, caught by an interpreter that only records them."""
    recorder = out / "python"
    recorder.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        "if sys.argv[1:3] == ['-m', 'btk_trainer.bench']:\n"
        f"    open({str(out / 'argv.json')!r}, 'w').write(json.dumps(sys.argv[3:]))\n")
    recorder.chmod(0o755)
    subprocess.run(["bash", str(RUN_H200)], capture_output=True, text=True, timeout=60, check=True,
                   env={"OUT": str(out), "WHEELS": str(out / "no-wheels"), "PYTHON": str(recorder),
                        "PATH": "/usr/bin:/bin"})
    argv: list[str] = json.loads((out / "argv.json").read_text())
    return argv


def test_default_run_is_expected_to_fit_nine_minutes(tmp_path: Path, fixture_profiles: None,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The script's own default cases, estimated for a GPU (compilation counted): start-up to last run within
    the 540-s budget the script passes, so nothing is planned to be skipped."""
    from btk_trainer.bench import COST_MODEL, build_bench, parse_args

    argv = _planned_runs(tmp_path)
    args = parse_args([*argv, "--plan-only"])
    assert args.budget_seconds == 540 <= 9 * 60
    bench = build_bench(args, on_gpu=True, started_at=0.0)
    trained = [case for case in bench.cases if case.same_as is None]
    assert {run.case.number for run in bench.runs if run.kind == "throughput"} == {c.number for c in trained}
    total = COST_MODEL.start + sum(run.estimated_seconds for run in bench.runs)
    assert total <= args.budget_seconds
    bench.print_plan()
    printed = capsys.readouterr().out
    assert f"expected total {total / 60:.1f} min of a 9.0-min budget" in printed
    assert "expected to be skipped" not in printed


def test_budget_skips_the_runs_whose_estimate_would_end_past_it(fixture_profiles: None,
                                                                capsys: pytest.CaptureFixture[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A clock that advances by each run's estimate: the runs that fit run, the rest are skipped and say so,
    both in the plan printed first and when their turn comes."""
    from btk_trainer.bench import Bench, Run, build_bench, parse_args

    argv = ["--profile", fc.LLAMA_1B.name, "--profile", fc.LLAMA_3B.name, "--gpus", "1", "--precision", "bf16",
            "--compare", "--device", "cpu"]
    probe = build_bench(parse_args(argv), on_gpu=False, started_at=0.0)
    budget = sum(run.estimated_seconds for run in probe.runs[:2]) + 1.0  # room for the first two runs only
    bench = build_bench(parse_args([*argv, "--budget-seconds", str(budget)]), on_gpu=False, started_at=0.0)
    clock = [0.0]
    ran: list[tuple[int, str]] = []

    def execute(self: Bench, run: Run) -> None:
        clock[0] += run.estimated_seconds
        ran.append((run.case.number, run.kind))
        if run.kind == "throughput":
            run.case.measured = {"tokens_per_second_per_gpu": 1.0}

    monkeypatch.setattr(Bench, "elapsed", lambda self: clock[0])
    monkeypatch.setattr(Bench, "execute", execute)
    bench.print_plan()
    bench.run_all()
    printed = capsys.readouterr().out
    assert ran == [(run.case.number, run.kind) for run in bench.runs[:2]]
    skipped = bench.runs[2:]
    assert skipped and f"past the {budget / 60:.1f}-min budget" in printed
    expected_skips = ", ".join(f"case {run.case.number} {run.kind}" for run in skipped)
    assert f"expected to be skipped for the budget: {expected_skips} " in printed
    for run in skipped:
        status = run.case.runs[run.kind]["status"]
        if run.kind == "throughput" or run.case.measured is not None:
            assert status.startswith("skipped: estimated"), status
        else:  # a diagnostic run of a case whose throughput run was skipped
            assert status == "not run: the throughput run has no figures"
        if run.kind == "throughput":
            assert run.case.as_json()["status"] == "skipped"


def test_measured_compilation_rescales_the_later_runs_and_the_budget_decides_on_it(
        fixture_profiles: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The first throughput run's start-up and compilation (its first step less one timed step), measured at three
    times CostModel's allowance, triples the allowances of the runs after it: a run that fitted the budget on the
    assumed figures is skipped on the measured ones."""
    from btk_trainer.bench import Bench, Run, build_bench, parse_args

    argv = ["--profile", fc.LLAMA_1B.name, "--gpus", "1", "--precision", "bf16", "--precision", "fp8_tensorwise"]
    probe = build_bench(parse_args(argv), on_gpu=True, started_at=0.0)
    first, second = probe.runs[0], probe.runs[1]
    assert first.kind == second.kind == "throughput" and first.allowance_seconds > 0
    budget = first.estimated_seconds + second.estimated_seconds + 1.0  # both fit on the assumed allowances
    bench = build_bench(parse_args([*argv, "--budget-seconds", str(budget), "--no-phases"]), on_gpu=True,
                        started_at=0.0)
    clock = [0.0]
    knobs = bench.runs[0].case.knobs
    step_seconds = 2.0
    rate = knobs.micro_batch_size * knobs.gradient_accumulation_steps * knobs.seq_len / step_seconds

    def execute(self: Bench, run: Run) -> None:
        clock[0] += run.estimated_seconds
        run.case.measured = {"tokens_per_second_per_gpu": rate,
                             "first_step_seconds": 3 * run.allowance_seconds + step_seconds}

    import btk_trainer.bench as bench_module

    monkeypatch.setattr(Bench, "elapsed", lambda self: clock[0])
    monkeypatch.setattr(Bench, "execute", execute)
    monkeypatch.setattr(bench_module, "release_device_memory", lambda on_gpu: None)  # no GPU here
    assigned = bench.runs[1].allowance_seconds
    bench.run_all()
    printed = capsys.readouterr().out
    assert bench.runs[1].allowance_seconds == pytest.approx(3 * assigned)
    assert bench.runs[0].case.runs["throughput"]["start_and_compile_seconds"] == pytest.approx(
        3 * bench.runs[0].allowance_seconds, abs=0.1)
    assert "the later runs' allowances x3.00" in printed
    assert bench.runs[1].case.runs["throughput"]["status"].startswith("skipped: estimated")


def test_each_run_frees_the_model_and_optimizer_of_the_run_before(one_rank: None, fixture_profiles: None,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """No model or optimizer of an earlier run is left (not even as garbage awaiting the cycle collector) when a
    run starts, after a failed run too."""
    import btk_trainer.train as train_module
    from btk_trainer.bench import build_bench, parse_args

    built: weakref.WeakSet[object] = weakref.WeakSet()  # an entry goes when its object is freed
    alive_at_start: list[int] = []
    real_train, real_build_model, real_build_optimizer = (
        train_module.train, train_module.build_model, train_module.build_optimizer)

    def counting_train(config: train_module.RunConfig) -> train_module.RunResult:
        alive_at_start.append(len(built))
        return real_train(config)

    def tracked(build: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            made = build(*args, **kwargs)
            built.add(made)
            return made
        return wrapper

    monkeypatch.setattr(train_module, "train", counting_train)
    monkeypatch.setattr(train_module, "build_model", tracked(real_build_model))
    monkeypatch.setattr(train_module, "build_optimizer", tracked(real_build_optimizer))
    args = parse_args(["--profile", fc.LLAMA_1B.name, "--profile", fc.LLAMA_3B.name, "--gpus", "1", *TOY_RUN,
                       "--precision", "bf16", "--inject-failure", "1:phases"])
    bench = build_bench(args, on_gpu=False, started_at=0.0)
    bench.run_all()
    assert len(alive_at_start) == len(bench.runs) == 6  # 2 cases x throughput, phases, communication
    assert alive_at_start == [0] * 6
    assert bench.cases[0].runs["phases"]["status"] == "failed"
    second = bench.cases[1].as_json()["measured"]
    assert second["phase_seconds_per_step"]["forward"] > 0 and second["phase_seconds_per_step"]["backward"] > 0
    assert 0 <= second["communication_seconds_per_step"]["exposed"] <= second["communication_seconds_per_step"]["total"]


def test_bench_predict_only_trains_nothing(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-c", WITH_FIXTURE_PROFILES, "--profile", fc.LLAMA_3B.name, "--gpus", "1", "--device", "cpu",
         "--precision", "bf16", "--compare", "--predict-only", "--json", str(tmp_path / "r.json")],
        capture_output=True, text=True, timeout=120, check=False,
        env={"PYTHONPATH": f"{ROOT / 'containers'}:{ROOT}:{ROOT / 'tests'}", "PATH": "/usr/bin:/bin"},
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert all("measured" not in case and case["note"] == "prediction only" for case in report["cases"])
    assert report["cases"][0]["knobs"]["seq_len"] == fc.LLAMA_3B.training.seq_len == 8192  # the real profile
    assert all(case["predicted"]["fits"] for case in report["cases"])
    (comparison,) = report["comparisons"]
    assert "measured_ratio" not in comparison and comparison["predicted_ratio"] > 1.0
    assert "btk_metric" not in completed.stdout


def test_bad_failure_injection_is_one_line(fixture_profiles: None, capsys: pytest.CaptureFixture[str]) -> None:
    from btk_trainer.bench import main

    assert main(["--profile", fc.LLAMA_1B.name, "--plan-only", "--inject-failure", "two:kill"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("btk-bench: error: --inject-failure 'two:kill': expected N:WHAT")


def test_phase_line_shows_profiled_communication() -> None:
    from btk_trainer.bench import phase_line

    phases = {"forward": 0.0123, "communication": 0.0005}
    communication = {"total": 0.0034, "exposed": 0.0011}
    case: dict[str, Any] = {"profile": "p", "label": "c", "measured": {
        "phase_seconds_per_step": phases, "communication_seconds_per_step": communication}}
    assert phase_line(case) == ("btk-bench phases p / c: forward 12.3 ms, communication 0.5 ms; "
                                "profiled communication 3.4 ms (exposed 1.1 ms)")
    case["measured"] = {"phase_seconds_per_step": phases}  # no profiled run: the phases alone
    assert phase_line(case) == "btk-bench phases p / c: forward 12.3 ms, communication 0.5 ms"
    case["measured"] = {"communication_seconds_per_step": communication}  # the phase run failed
    assert phase_line(case) == "btk-bench phases p / c: profiled communication 3.4 ms (exposed 1.1 ms)"


# --- the wheels the H200 machine lacks ----------------------------------------------------------

def _names(path: Path) -> Iterator[str]:
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            yield line.split()[0]


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for pin in _names(BENCH / "wheels.txt"):
        name, _, version = pin.partition("==")
        assert version, f"wheels.txt: {pin} is not NAME==VERSION"
        assert canonicalize_name(name) not in pins, f"wheels.txt: {name} twice"
        pins[canonicalize_name(name)] = version
    return pins


#: Imports of loaded modules that the benchmark never reaches, with the reason.
NEVER_IMPORTED_BY_THE_BENCH = {
    "boto3": "btk.capacity's AWS calls (training-plan search and purchase)",
    "botocore": "btk.capacity's AWS calls",
}


def _project_modules_the_bench_loads() -> list[Path]:
    """Files of the btk, btk_trainer and profiles modules the benchmark's run loads."""
    script = ("import sys; import btk_trainer.bench, btk_trainer.train, btk_trainer.comm_profile, btk.planner.search; "
              "from btk.catalog import all_profiles; all_profiles(); "
              "print('\\n'.join(m.__file__ for n, m in list(sys.modules.items()) if getattr(m, '__file__', None) "
              "and n.split('.')[0] in ('btk', 'btk_trainer', 'profiles', 'environments')))")
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                               check=True, cwd=ROOT, env={"PYTHONPATH": f"{ROOT / 'containers'}:{ROOT}",
                                                          "PATH": "/usr/bin:/bin"})
    return sorted({Path(line) for line in completed.stdout.splitlines() if line.endswith(".py")})


def _top_level_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_wheels_and_the_machine_cover_every_import_of_the_benchmark() -> None:
    """Every third-party package the loaded modules import (lazy imports too: torchao) is on the H200 machine or
    pinned in wheels.txt, and each pinned wheel's own requirements (read from its metadata where this
    environment has that very version) are met there: typing-extensions >= what pydantic needs, for one."""
    pins = _pins()
    on_machine = {canonicalize_name(name) for name in _names(BENCH / "device_packages.txt")}
    project = {"btk", "btk_trainer", "profiles", "environments"}
    modules = set().union(*(_top_level_imports(path) for path in _project_modules_the_bench_loads()))
    third_party = modules - set(sys.stdlib_module_names) - project - set(NEVER_IMPORTED_BY_THE_BENCH)
    distributions = metadata.packages_distributions()
    assert {"pydantic", "torch", "torchao", "numpy"} <= third_party  # the scan sees lazy imports
    for module in sorted(third_party):
        names = {canonicalize_name(name) for name in distributions.get(module, [module])}
        assert names & (on_machine | set(pins)), f"{module} ({names}) is neither on the machine nor in wheels.txt"

    environment = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
                   "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
                   "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}
    checked = 0
    for name, version in pins.items():
        try:
            if metadata.version(name) != version:
                continue  # this environment has another version: its requirements may differ
        except metadata.PackageNotFoundError:
            continue
        for requirement in map(Requirement, metadata.requires(name) or []):
            if requirement.marker is not None and not Marker(str(requirement.marker)).evaluate(environment):
                continue  # an extra, or another platform's
            needed = canonicalize_name(requirement.name)
            assert needed in pins or needed in on_machine, f"{name} {version} needs {requirement}: not pinned"
            if needed in pins:
                assert requirement.specifier.contains(pins[needed], prereleases=True), (
                    f"{name} {version} needs {requirement}; wheels.txt pins {pins[needed]}")
        checked += 1
    assert checked >= 2  # pydantic and pydantic-core at least: the image's lock pins the same versions


def test_bench_scripts_pass_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed")
    completed = subprocess.run([shellcheck, *map(str, sorted(BENCH.glob("*.sh")))],
                               capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stdout
