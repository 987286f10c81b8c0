"""Fixtures for the infrastructure tests: each environment is synthesized once per session."""

from __future__ import annotations

from stack_synth import synth, synths

__all__ = ["synth", "synths"]
