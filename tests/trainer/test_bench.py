"""The GPU benchmark and its one-shot H200 script, run on CPU with a toy architecture.

The script runs on profiles of the user's catalog (``BENCH_PROFILES``: with ``--tiny`` only
their names and training intent matter); the predict-only run uses a fixture profile
(``tests/fixture_catalog.py``), whose real sequence length and size the assertions pin.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import fixture_catalog as fc
import torch

from btk.catalog import all_profiles

ROOT = Path(__file__).resolve().parents[2]
#: Runs the benchmark with btk.catalog pointed at the fixture profiles.
WITH_FIXTURE_PROFILES = (
    "import sys; import fixture_catalog as fc; from btk import catalog; "
    "catalog.all_profiles = lambda: dict(fc.PROFILES); "
    "from btk_trainer.bench import main; raise SystemExit(main(sys.argv[1:]))"
)


def test_bench_script_runs_on_cpu(tmp_path: Path) -> None:
    """The exact script the H200 run uses, with the toy architecture on CPU: every case lands in the files."""
    out = tmp_path / "out"
    names = sorted(all_profiles())[:2]  # the user's profiles: the script looks them up in profiles/
    completed = subprocess.run(
        ["bash", str(ROOT / "containers" / "bench" / "run_h200.sh"), "--tiny", "--device", "cpu",
         "--warmup", "1", "--steps", "2"],
        capture_output=True, text=True, timeout=240, check=False,
        env={"OUT": str(out), "WHEELS": str(tmp_path / "no-wheels"), "PYTHON": sys.executable,
             "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "2", "BENCH_PROFILES": " ".join(names)},
    )
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]
    assert "bench exit status: 0" in completed.stdout
    assert f"torch {torch.__version__}" in (out / "env.txt").read_text()
    report = json.loads((out / "results.json").read_text())
    assert report["instance"] == "ml.p5en.48xlarge (1 GPU)" and report["steps"] == 2
    cases = [(case["profile"], case["label"]) for case in report["cases"]]
    expected = ["planned knobs, bf16", "planned knobs, fp8_tensorwise", "planner's choice", "legacy baseline"]
    assert cases == [(profile, label) for profile in names for label in expected]
    for case in report["cases"]:
        assert case["predicted"]["tokens_per_second_per_gpu"] > 0
        if case["knobs"]["precision"] != "bf16":  # fp8 cannot run on CPU: the case says why, the rest still run
            assert "needs an NVIDIA GPU" in case["error"] and "measured" not in case
            continue
        assert case["measured"]["tokens_per_second_per_gpu"] > 0
    assert [c["profile"] for c in report["comparisons"]] == names
    assert all(c["measured_ratio"] > 0 and c["predicted_ratio"] > 0 for c in report["comparisons"])
    table = (out / "performance.md").read_text()
    assert f"| {names[-1]} | legacy baseline |" in table and "planned / baseline measured" in table
    # every trained case's metric lines (1 warm-up + 2 timed steps) reach the log; each profile trains
    trained = [case for case in report["cases"]
               if "measured" in case and case.get("note") != "same knobs as an earlier case"]
    assert {case["profile"] for case in trained} == set(names)
    assert (out / "bench.log").read_text().count("btk_metric step=") >= 3 * len(trained)
    phases = [line for line in completed.stdout.splitlines() if line.startswith(f"btk-bench phases {names[-1]}")]
    assert phases and all(f" {name} " in phases[0] for name in
                          ("data", "forward", "backward", "communication", "optimizer", "checkpoint"))
    measured = next(case["measured"] for case in report["cases"] if "measured" in case)
    assert measured["phase_seconds_per_step"]["forward"] > 0 and measured["phase_seconds_per_step"]["backward"] > 0


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


def test_phase_line_shows_profiled_communication() -> None:
    from btk_trainer.bench import phase_line

    case = {"profile": "p", "label": "c", "measured": {
        "phase_seconds_per_step": {"forward": 0.0123, "communication": 0.0005},
        "communication_seconds_per_step": {"total": 0.0034, "exposed": 0.0011}}}
    assert phase_line(case) == ("btk-bench phases p / c: forward 12.3 ms, communication 0.5 ms; "
                                "profiled communication 3.4 ms (exposed 1.1 ms)")
    del case["measured"]["communication_seconds_per_step"]  # a report without it: the phases alone
    assert phase_line(case) == "btk-bench phases p / c: forward 12.3 ms, communication 0.5 ms"


def test_measure_profiles_communication_in_one_process(one_rank: None) -> None:
    """One process: the profiled run works; only all-reduces over a group of one remain (microseconds)."""
    from btk_trainer.bench import TINY, measure

    from btk.knobs import TrainingKnobs

    training = fc.LLAMA_1B.training.model_copy(update={"seq_len": 32, "global_batch_tokens": 32})
    profile = fc.LLAMA_1B.model_copy(update={"architecture": TINY, "training": training})
    knobs = TrainingKnobs(micro_batch_size=1, seq_len=32, compile=False, fused_loss=False)
    measured = measure(profile, knobs, warmup=1, steps=1, device="cpu", nnodes=1)
    communication = measured["communication_seconds_per_step"]
    assert set(communication) == {"total", "exposed"}
    assert 0 <= communication["exposed"] <= communication["total"] < 5e-3
    assert measured["phase_seconds_per_step"]["forward"] > 0  # the phase timing is still there
