"""Unit conversions shared by the planner, the capacity logic, the report and the constructs."""

from __future__ import annotations

SECONDS_PER_HOUR = 3600
"""Seconds in an hour: SageMaker's stopping conditions are in seconds, prices and plans in hours."""

HOURS_PER_DAY = 24
"""Hours in a day: training plans are sold in whole days."""
