"""Fixtures for the README's workflows: the synthesized stacks shared with tests/infra and tests/pipeline."""

from stack_synth import synths

__all__ = ["synths"]
