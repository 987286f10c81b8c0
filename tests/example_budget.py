"""How many examples a property suite draws: its own budget, capped where a run asks for fewer.

``BTK_EXAMPLE_CAP`` (a whole number), when set, caps every suite's budget. The suite's re-run on
another user's config (tests/workflow/test_user_config_independence.py) sets it: there the question
is whether a test depends on the shipped profiles and environments, which its first examples
answer as well as its last; the properties themselves are proved by the full budgets of the main run.
"""

from __future__ import annotations

import os

CAP_ENV = "BTK_EXAMPLE_CAP"


def capped(budget: int) -> int:
    """``budget``, or the cap in :data:`CAP_ENV` where that is lower."""
    cap = os.environ.get(CAP_ENV, "").strip()
    return min(budget, int(cap)) if cap else budget
