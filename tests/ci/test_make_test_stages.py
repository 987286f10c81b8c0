"""`make test` runs every stage even after a failure and ends with a summary of each stage's outcome."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "test_stages.sh"


def _run(tmp_path: Path, failing: set[str], *stages: str) -> subprocess.CompletedProcess[str]:
    """The stage runner with a stand-in for make that fails the named stages and logs every call."""
    fake = tmp_path / "fake-make"
    log = tmp_path / "calls"
    fails = " ".join(failing)
    fake.write_text(f'#!/usr/bin/env bash\necho "$2" >> {log}\ncase " {fails} " in *" $2 "*) exit 2;; esac\n')
    fake.chmod(0o755)
    return subprocess.run(["bash", str(SCRIPT), str(fake), *stages], capture_output=True, text=True, check=False)


def _summary(out: str) -> dict[str, str]:
    return {match["stage"]: match["outcome"]
            for match in re.finditer(r"^  (?P<outcome>passed|failed|skipped)\s+(?P<stage>\S+)", out, re.MULTILINE)}


def test_all_stages_pass(tmp_path: Path) -> None:
    done = _run(tmp_path, set(), "setup", "lint:setup", "pytest:setup")
    assert done.returncode == 0 and done.stdout.rstrip().endswith("make test: all stages passed")
    assert _summary(done.stdout) == {"setup": "passed", "lint": "passed", "pytest": "passed"}


def test_a_failure_does_not_stop_the_stages_after_it(tmp_path: Path) -> None:
    done = _run(tmp_path, {"lint", "synth-all"}, "setup", "lint:setup", "typecheck:setup", "pytest:setup",
                "synth-all:setup", "cfn-lint:synth-all", "checkov:synth-all", "hadolint:setup")
    assert done.returncode == 1 and done.stdout.rstrip().endswith("make test: FAILED")
    assert _summary(done.stdout) == {"setup": "passed", "lint": "failed", "typecheck": "passed", "pytest": "passed",
                                     "synth-all": "failed", "cfn-lint": "skipped", "checkov": "skipped",
                                     "hadolint": "passed"}
    assert "cfn-lint    (synth-all did not pass)" in done.stdout
    ran = (tmp_path / "calls").read_text().split()
    assert ran == ["setup", "lint", "typecheck", "pytest", "synth-all", "hadolint"]  # skipped ones never start


def test_a_background_stage_runs_beside_the_next_and_is_summarised_in_order(tmp_path: Path) -> None:
    """`typecheck:setup&` starts, `pytest` runs while it does, and both are in the summary in the order given;
    a background stage's failure fails the run, prints its output, and skips what needs it."""
    fake = tmp_path / "fake-make"
    log = tmp_path / "calls"
    fake.write_text(f'#!/usr/bin/env bash\necho "start $2" >> {log}\n'
                    f'[ "$2" = typecheck ] && {{ sleep 1; echo "mypy says no"; echo "end $2" >> {log}; exit 1; }}\n'
                    f'echo "end $2" >> {log}\n')
    fake.chmod(0o755)
    done = subprocess.run(["bash", str(SCRIPT), str(fake), "setup", "typecheck:setup&", "pytest:setup",
                           "after:typecheck"], capture_output=True, text=True, check=False)
    assert done.returncode == 1 and done.stdout.rstrip().endswith("make test: FAILED")
    assert _summary(done.stdout) == {"setup": "passed", "typecheck": "failed", "pytest": "passed", "after": "skipped"}
    assert list(_summary(done.stdout)) == ["setup", "typecheck", "pytest", "after"]
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls.index("start pytest") < calls.index("end typecheck"), calls  # pytest ran while typecheck did
    assert "mypy says no" in done.stdout and "after       (typecheck did not pass)" in done.stdout


def test_make_test_declares_every_check_as_a_stage() -> None:
    """Each check the Makefile defines is a stage of `make test`, so none can be left out of the summary."""
    makefile = (ROOT / "Makefile").read_text()
    stages_text = re.search(r"^TEST_STAGES := (.*?)(?<!\\)\n", makefile, re.MULTILINE | re.DOTALL)
    assert stages_text is not None
    stages = {spec.strip("'").split(":")[0].rstrip("&") for spec in stages_text.group(1).replace("\\\n", " ").split()}
    assert stages == {"setup", "lint", "typecheck", "deploy-rehearsal", "gpu-bench-readiness", "pytest", "synth-all",
                      "cfn-lint", "checkov", "hadolint", "actionlint", "zizmor"}
    assert re.search(r"^test:\n\tbash scripts/test_stages\.sh .*\$\(TEST_STAGES\)$", makefile, re.MULTILINE)


def _node_options_under_make(user_value: str | None) -> str:
    """NODE_OPTIONS as a command run by the Makefile sees it, with ``user_value`` in the caller's environment."""
    env = {key: value for key, value in os.environ.items() if key not in ("NODE_OPTIONS", "MAKEFLAGS", "MAKELEVEL")}
    if user_value is not None:
        env["NODE_OPTIONS"] = user_value
    target = 'show-node-options: ; @echo "$$NODE_OPTIONS"'
    shown = subprocess.run(["make", "-s", "--eval", target, "show-node-options"], cwd=ROOT, env=env,
                           capture_output=True, text=True, check=True)
    return shown.stdout.strip()


def _node_threads(node_options: str) -> int:
    """How many threads a Node.js process runs with ``node_options`` (V8's helper pool among them)."""
    script = "console.log(require('fs').readdirSync('/proc/self/task').length)"
    env = {**os.environ, "NODE_OPTIONS": node_options}
    return int(subprocess.run(["node", "-e", script], env=env, capture_output=True, text=True, check=True).stdout)


def test_the_cdks_node_processes_get_one_v8_helper_thread_unless_the_user_says_otherwise() -> None:
    """Node.js's default V8 pool of four threads costs each CDK app's jsii kernel about 3 CPU-s more per synth on
    2 cores; the Makefile asks for one, and a ``--v8-pool-size`` of the caller's own comes later, so it wins."""
    assert _node_options_under_make(None) == "--v8-pool-size=1"
    assert _node_options_under_make("--max-old-space-size=2048 --v8-pool-size=3").split() == [
        "--v8-pool-size=1", "--max-old-space-size=2048", "--v8-pool-size=3"]
    one, three, default = (_node_threads(options) for options in ("--v8-pool-size=1", "--v8-pool-size=1 "
                                                                  "--v8-pool-size=3", ""))
    assert one + 2 == three and one < default  # Node.js reads the option, and the last one wins
