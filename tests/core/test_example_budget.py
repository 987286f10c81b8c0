"""The property suites' example budgets: their own figure unless a run caps it."""

from __future__ import annotations

import pytest
from example_budget import CAP_ENV, capped


def test_without_a_cap_every_budget_is_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CAP_ENV, raising=False)
    assert [capped(n) for n in (1, 12, 600)] == [1, 12, 600]


def test_a_cap_lowers_larger_budgets_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CAP_ENV, "20")
    assert [capped(n) for n in (8, 20, 300)] == [8, 20, 20]
