"""The knob ladder: a job that runs out of memory before its first checkpoint restarts on leaner knobs.

The planner hands the job an ordered ladder of knob sets (``job.knob_ladder``,
:func:`btk.planner.search.knob_ladder`): each trains the plan's global batch, sequence and
precision with less memory. On a single-node job the entry point runs torchrun with one restart
per rung (``--max-restarts``). A rank that runs out of memory while no checkpoint of the job
exists records the next rung in the node's ladder state file (:func:`step_down`) and exits with
:data:`EXIT_STEP_DOWN`; torchrun stops the node's other processes and starts them all again, and
every process reads the rung from the file (:func:`current_rung`) and trains on it from step 0,
with the same batches an uninterrupted run on that rung would see. A job may start further down
(``job.start_rung``): the pipeline starts the long run on the rung its rehearsal held. Once a checkpoint exists the
knobs no longer change: an out-of-memory there fails the job in one line. A restart the state
file does not account for (the previous attempt failed for another reason) fails at once, so
torchrun's restarts are spent on memory only and a real error is not retried.

The rung a job trains on is recorded beside its checkpoints (:data:`RUNG_RECORD`, :func:`record_rung`): a
later job of the same execution that resumes from them (a retry after a capacity error, a spot
interruption) trains on the rung they were written on (:func:`resumed_rung`), whatever rung it
would start on itself, so nothing past the first checkpoint changes.

Multi-node jobs get no restarts (torchrun's static rendezvous restarts one node's processes, not
the other nodes'): there an out-of-memory fails the job naming the next rung to plan with.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from btk.errors import BtkError
from btk.files import write_atomically
from btk.hyperparameters import JobHyperparameters
from btk.knobs import TrainingKnobs

LADDER_STATE_ENV = "BTK_LADDER_STATE"
RUNG_RECORD = "KNOB_RUNG.json"
"""Beside the checkpoints (synced to S3 with them): ``{"rung": N}``, the rung the job writing them trained on."""
DEFAULT_LADDER_STATE = Path("/tmp/btk/knob_ladder.json")
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"  # torchrun's: 0 for the first attempt, then 1, 2, ...
EXIT_STEP_DOWN = 75
"""The exit status of a rank that stepped down (``EX_TEMPFAIL``: try again)."""


class LadderState(BaseModel):
    """What the rank that ran out of memory left for the next attempt."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rung: int = Field(ge=1)
    attempt: int = Field(ge=1, description="the torchrun restart this rung is for")
    reason: str


def rungs(spec: JobHyperparameters) -> tuple[TrainingKnobs, ...]:
    """The plan's knobs, then the ladder's."""
    ladder = spec.job.knob_ladder
    return (spec.knobs, *(ladder.rungs if ladder is not None else ()))


def describe(knobs: TrainingKnobs) -> str:
    return (f"micro_batch_size={knobs.micro_batch_size} gradient_accumulation_steps={knobs.gradient_accumulation_steps}"
            f" activation_checkpointing={knobs.activation_checkpointing} sharding={knobs.sharding}")


def _read(path: Path) -> LadderState | None:
    try:
        return LadderState.model_validate_json(path.read_bytes())
    except (OSError, ValidationError):
        return None


def current_rung(path: Path | None, restart: int, spec: JobHyperparameters) -> tuple[int, str | None]:
    """The rung this attempt trains on (0: the plan; the first attempt: ``job.start_rung``) and why it is not the
    plan; BtkError when the previous
    attempt failed for another reason than running out of memory before the first checkpoint."""
    if restart == 0 or path is None:
        if path is not None:
            path.unlink(missing_ok=True)  # a state left by an earlier job in this container is not this job's
        start = spec.job.start_rung
        return start, (f"the job starts on it (job.start_rung): its rehearsal held rung {start}" if start else None)
    state = _read(path)
    if state is None or state.attempt != restart or state.rung >= len(rungs(spec)):
        raise BtkError(f"attempt {restart + 1} of this job follows a failure other than running out of memory "
                       "before the first checkpoint (see the log above); not training again")
    return state.rung, f"the previous attempt: {state.reason}"


def on_rung(spec: JobHyperparameters, rung: int) -> JobHyperparameters:
    """``spec`` training on rung ``rung`` (0: unchanged)."""
    return spec if rung == 0 else spec.model_copy(update={"knobs": rungs(spec)[rung]})


def step_down(path: Path | None, spec: JobHyperparameters, rung: int, restart: int, cause: str, *,
              can_restart: bool) -> tuple[bool, str]:
    """After an out-of-memory before the first checkpoint on ``rung``: (whether the job restarts on the next rung,
    the one line to log). Records the next rung for the restart when there is one."""
    ladder = rungs(spec)
    failed = f"out of memory before the first checkpoint on knob rung {rung} of {len(ladder) - 1} ({cause})"
    if rung + 1 >= len(ladder):
        return False, (f"{failed}; no leaner rung is left (job.knob_ladder): lower micro_batch_size or turn on "
                       "activation checkpointing in the profile's pins")
    following = ladder[rung + 1]
    if not can_restart or path is None:
        return False, (f"{failed}; this job cannot restart itself (multi-node): plan it with {describe(following)}, "
                       "the next rung")
    state = LadderState(rung=rung + 1, attempt=restart + 1, reason=failed)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, state.model_dump_json())
    return True, f"{failed}; restarting on rung {rung + 1}: {describe(following)}"


class RungRecord(BaseModel):
    """The rung the checkpoints beside it were written on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rung: int = Field(ge=0)


def record_rung(checkpoint_dir: Path, rung: int) -> None:
    """Say which rung this job trains on beside its checkpoints (before the first is written)."""
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(checkpoint_dir / RUNG_RECORD, RungRecord(rung=rung).model_dump_json())


def resumed_rung(checkpoint_dir: Path | None, spec: JobHyperparameters, rung: int) -> tuple[int, str | None]:
    """The rung to train on where this job resumes from checkpoints another job wrote on another rung (their
    record's, and why), else ``(rung, None)``. No checkpoint, no record, or a record this ladder does not have:
    ``rung`` stands."""
    from btk_trainer.checkpoint import latest_checkpoint

    if checkpoint_dir is None:
        return rung, None
    latest = latest_checkpoint(checkpoint_dir)
    if latest is None:
        return rung, None
    try:
        recorded = RungRecord.model_validate_json((checkpoint_dir / RUNG_RECORD).read_bytes()).rung
    except (OSError, ValidationError):
        return rung, None
    if recorded == rung or recorded >= len(rungs(spec)):
        return rung, None
    return recorded, f"its checkpoints up to step {latest[0]} were written on it: the knobs do not change past one"
