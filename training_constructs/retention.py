"""CloudWatch Logs retention: the environment's ``log_retention_days`` → the CDK enum member."""

from __future__ import annotations

from aws_cdk import aws_logs as logs

from btk.environment import LOG_RETENTION_DAYS

#: The enum members in the order of ``LOG_RETENTION_DAYS`` (the CDK names them, not their days).
_MEMBERS = (
    logs.RetentionDays.ONE_DAY,
    logs.RetentionDays.THREE_DAYS,
    logs.RetentionDays.FIVE_DAYS,
    logs.RetentionDays.ONE_WEEK,
    logs.RetentionDays.TWO_WEEKS,
    logs.RetentionDays.ONE_MONTH,
    logs.RetentionDays.TWO_MONTHS,
    logs.RetentionDays.THREE_MONTHS,
    logs.RetentionDays.FOUR_MONTHS,
    logs.RetentionDays.FIVE_MONTHS,
    logs.RetentionDays.SIX_MONTHS,
    logs.RetentionDays.ONE_YEAR,
    logs.RetentionDays.THIRTEEN_MONTHS,
    logs.RetentionDays.EIGHTEEN_MONTHS,
    logs.RetentionDays.TWO_YEARS,
    logs.RetentionDays.THREE_YEARS,
    logs.RetentionDays.FIVE_YEARS,
    logs.RetentionDays.SIX_YEARS,
    logs.RetentionDays.SEVEN_YEARS,
    logs.RetentionDays.EIGHT_YEARS,
    logs.RetentionDays.NINE_YEARS,
    logs.RetentionDays.TEN_YEARS,
)

#: Every retention the environment accepts, keyed by days (``strict``: the two lists cannot drift apart).
RETENTION_DAYS: dict[int, logs.RetentionDays] = dict(zip(LOG_RETENTION_DAYS, _MEMBERS, strict=True))
