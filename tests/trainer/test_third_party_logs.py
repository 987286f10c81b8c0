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


def _run(code: str) -> subprocess.CompletedProcess[str]:
    paths = (REPO / "containers", REPO, REPO / "tests", REPO / "tests" / "trainer")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(path) for path in paths)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


# The trainer's modules imported first (they install the filters), then torchao as the float8 paths import it, then a
# toy's step under tensor parallelism, whose gradient clipping reduces the norm over the (dp_shard, tp) mesh (DTensor
# logs its note once per process). Every message a filter drops is recorded and printed as JSON.
TRAINER_RUN = f"""
import json
from btk_trainer import dryrun, third_party_logs
{IMPORT_TORCHAO}
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


def test_the_trainer_prints_no_line_nobody_can_act_on() -> None:
    bare = _run(IMPORT_TORCHAO).stderr
    # the pinned torchao does print both kinds on this machine: the check below is not vacuous
    assert "Failed to load" in bare and "register_constant() on Enum subclasses is deprecated" in bare
    quiet = _run(TRAINER_RUN)
    assert "Failed to load" not in quiet.stderr and "register_constant" not in quiet.stderr, quiet.stderr[-2000:]
    # torch does log the norm's note (the filter saw it) and it reaches no one
    [note] = [line for line in json.loads(quiet.stdout.splitlines()[-1]) if "_NormPartial" in line]
    assert "_NormPartial(2.0)" in note and "sequential all_reduce operations" in note
    assert "sequential all_reduce" not in quiet.stderr, quiet.stderr[-2000:]


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
