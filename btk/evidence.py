"""The team's own measured runs: the evidence the planner corrects its prediction with.

A file of :class:`MeasuredRun` records (rehearsals and long runs: the model, the instance type,
the node count, the knobs and the measured tokens/s per GPU), kept beside the project
(``btk-evidence.json`` by default, ``BTK_EVIDENCE`` or ``--evidence`` to name another) and
moved between machines with ``btk evidence import`` and ``export``. The planner reads it
(:mod:`btk.planner.evidence`); the published calibration stays the prior.

The file::

    {"version": 1, "runs": [{"id": "btk-prod-llama3-1-8b-reh-0001", "kind": "rehearsal",
      "profile": "llama3.1-8b", "architecture": {...}, "instance_type": "ml.p6-b200.48xlarge",
      "nodes": 1, "knobs": {...}, "tokens_per_second_per_gpu": 19012.5, "source": "..."}]}

Every failure to read it is one line naming the file and the field.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from btk.errors import BtkError, FieldError, one_line
from btk.files import write_atomically
from btk.jsonfile import parse_json, read_json_file
from btk.knobs import TrainingKnobs
from btk.profile import ModelArchitecture

EVIDENCE_ENV = "BTK_EVIDENCE"
DEFAULT_EVIDENCE_FILE = Path("btk-evidence.json")
EVIDENCE_VERSION = 1


class MeasuredRun(BaseModel):
    """One run the team measured: what trained where, and how fast."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$", description="unique: the job name, say")
    kind: Literal["rehearsal", "run"]
    profile: str = Field(min_length=1, max_length=64)
    architecture: ModelArchitecture
    instance_type: str = Field(pattern=r"^ml\.[a-z0-9-]+\.[a-z0-9]+$")
    nodes: int = Field(ge=1, le=64)
    knobs: TrainingKnobs
    tokens_per_second_per_gpu: float = Field(gt=0, lt=1e7, allow_inf_nan=False)
    source: str = Field(default="", max_length=512, description="where the figure comes from")


class Evidence(BaseModel):
    """The file's content: its version and the runs, each id once."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: int = EVIDENCE_VERSION
    runs: tuple[MeasuredRun, ...] = ()

    @model_validator(mode="after")
    def _unique(self) -> Evidence:
        if self.version != EVIDENCE_VERSION:
            raise FieldError("version", f"version {self.version} is not supported (expected {EVIDENCE_VERSION})")
        seen: set[str] = set()
        for run in self.runs:
            if run.id in seen:
                raise FieldError("runs", f"run id {run.id!r} appears twice")
            seen.add(run.id)
        return self


def evidence_path(path: Path | None = None) -> Path:
    """The evidence file: ``path``, else ``BTK_EVIDENCE``, else ``btk-evidence.json`` here."""
    if path is not None:
        return path
    named = os.environ.get(EVIDENCE_ENV, "").strip()
    return Path(named) if named else DEFAULT_EVIDENCE_FILE


def parse_evidence(text: bytes, where: str) -> Evidence:
    """An evidence document; BtkError naming ``where`` and the field."""
    try:
        return Evidence.model_validate(parse_json(text, where))
    except ValidationError as error:
        raise BtkError(f"{where}: {one_line(error)}") from None


def read_evidence(path: Path) -> Evidence:
    """The file at ``path``; no file is no evidence (a file that cannot be there, below a file, is one line, as is
    anything else unreadable)."""
    if not path.exists():
        above = next((parent for parent in path.parents if parent.exists()), None)
        if above is not None and not above.is_dir():
            raise BtkError(f"{path}: {above} is a file, not a folder")
        return Evidence()
    try:
        return Evidence.model_validate(read_json_file(path))
    except ValidationError as error:
        raise BtkError(f"{path}: {one_line(error)}") from None


def merged(evidence: Evidence, runs: Iterable[MeasuredRun]) -> tuple[Evidence, int, int]:
    """``evidence`` with ``runs`` added; a run whose id is there already replaces it. (result, added, replaced)"""
    by_id = {run.id: run for run in evidence.runs}
    added = replaced = 0
    for run in runs:
        if run.id in by_id:
            replaced += by_id[run.id] != run
        else:
            added += 1
        by_id[run.id] = run
    return Evidence(runs=tuple(by_id.values())), added, replaced


def write_evidence(path: Path, evidence: Evidence) -> None:
    """Write the file whole (a temporary file, then a rename: a reader never sees half of it)."""
    directory = path.parent if str(path.parent) else Path(".")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        write_atomically(path, evidence.model_dump_json(indent=1) + "\n")
    except OSError as error:
        raise BtkError(f"{path}: cannot be written ({error.strerror or error})") from None
