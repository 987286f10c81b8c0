"""``python -m btk.cli``."""

from btk.cli import run

run()
