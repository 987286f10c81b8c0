"""The trainer prints no third-party line a user cannot act on (torchao's CUDA extensions on a machine without
CUDA, torch's deprecation of torchao's Enum registrations, DTensor's note on the gradient norm's two all-reduces under
tensor parallelism), and nothing else is hidden."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

from btk_trainer.third_party_logs import DropMessages, quiet_third_party_logs

REPO = Path(__file__).resolve().parents[2]
IMPORT_TORCHAO = (
    "import torchao.float8; from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear; "
    "from torchao.quantization.quantize_.common.kernel_preference import KernelPreference"
)


def _stderr_of(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "containers"), str(REPO)])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_the_trainer_imports_torchao_without_lines_nobody_can_act_on() -> None:
    bare = _stderr_of(IMPORT_TORCHAO)
    # the pinned torchao does print both kinds on this machine: the check below is not vacuous
    assert "Failed to load" in bare and "register_constant() on Enum subclasses is deprecated" in bare
    quiet = _stderr_of("import btk_trainer.parallelize; " + IMPORT_TORCHAO)
    assert "Failed to load" not in quiet and "register_constant" not in quiet, quiet


TENSOR_PARALLEL_STEP = """
import json, sys
from btk_trainer import dryrun, third_party_logs
from test_dryrun import TRACKED

dropped = []
keep = third_party_logs.DropMessages.filter

def recording(self, record):
    kept = keep(self, record)
    if not kept:
        dropped.append(record.getMessage())
    return kept

third_party_logs.DropMessages.filter = recording
dryrun.run_steps(TRACKED["tp2"])
print(json.dumps(dropped))
"""


def test_a_tensor_parallel_step_prints_no_note_on_the_gradient_norms_reduction() -> None:
    """DTensor logs the line once per process, when clipping first reduces the norm over the (dp_shard, tp) mesh:
    a fresh process steps a toy under tensor parallelism; the filter saw the line (torch does log it) and dropped
    it, and nothing of it reached stderr."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        str(path) for path in (REPO / "containers", REPO, REPO / "tests", REPO / "tests" / "trainer"))}
    done = subprocess.run([sys.executable, "-c", TENSOR_PARALLEL_STEP], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    [note] = json.loads(done.stdout.splitlines()[-1])
    assert "_NormPartial(2.0)" in note and "sequential all_reduce operations" in note
    assert "sequential all_reduce" not in done.stderr and "_NormPartial" not in done.stderr, done.stderr[-2000:]


def test_only_the_named_messages_are_dropped() -> None:
    drop = DropMessages(("Failed to load ", "/torchao/_C"))
    record = logging.LogRecord("torchao", logging.WARNING, __file__, 1, "%s", ("x",), None)
    for message, kept in [
        ("Failed to load /x/torchao/_C_mxfp8.so: cannot open", False),
        ("Failed to load /x/other/_C.so: cannot open", True),
        ("Skipping import of cpp extensions due to incompatible torch version", True),
    ]:
        record.args = (message,)
        assert drop.filter(record) is kept, message


def test_only_the_norms_reductions_are_dropped() -> None:
    """Another tensor's sequential collectives (a gather of a sharded weight, say) keep their line."""
    quiet_third_party_logs(cuda_available=False)
    [drop] = [f for f in logging.getLogger("torch.distributed.tensor._redistribute").filters
              if isinstance(f, DropMessages)]
    record = logging.LogRecord("torch.distributed.tensor._redistribute", logging.WARNING, __file__, 1, "%s", ("x",),
                               None)
    note = "While redistributing from %s to (Replicate(), Replicate()), 2 sequential %s operations will be performed."
    for source, collective, kept in [
        ("(_NormPartial(2.0), _NormPartial(2.0))", "all_reduce", False),
        ("(Replicate(), _NormPartial(2.0), _NormPartial(2.0))", "all_reduce", False),
        ("(Partial(sum), Partial(sum))", "all_reduce", True),
        ("(Shard(dim=0), Shard(dim=0))", "all_gather", True),
    ]:
        record.args = (note % (source, collective),)
        assert drop.filter(record) is kept, source


def test_with_cuda_the_extension_lines_are_kept() -> None:
    name = "torchao"
    before = list(logging.getLogger(name).filters)
    try:
        for existing in before:
            logging.getLogger(name).removeFilter(existing)
        quiet_third_party_logs(cuda_available=True)
        assert not logging.getLogger(name).filters
        assert any(isinstance(f, DropMessages) for f in logging.getLogger("torch.utils._pytree").filters)
    finally:
        for existing in before:
            logging.getLogger(name).addFilter(existing)
