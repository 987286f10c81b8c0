"""Fixtures for the pipelines of the real TrainingStack: the same synths as tests/infra."""

from __future__ import annotations

from stack_synth import synth, synths

__all__ = ["synth", "synths"]
