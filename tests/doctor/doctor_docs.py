"""Keep docs/deploy.md's ``btk doctor`` sample current: the output of a scenario of the fixture catalog.

The scenario: environment ``staging`` in a fresh account before its first deploy. Its account
has no applied value for the training instance type, so AWS's default of 0 instances stands:
the ``ResourceLimitExceeded`` that would otherwise surface minutes after a pipeline starts.

Run ``.venv/bin/python tests/doctor/doctor_docs.py`` after changing the doctor's output;
``test_doctor_docs.py`` fails while the file is stale.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "deploy.md"
MARKER = "doctor-sample"
SAMPLE_ENV = "staging"


def sample() -> str:
    """The sample block: the command and what it prints."""
    import fixture_catalog
    from doctor_fixtures import by_service, doctor, fsx_quotas, healthy_account, jobs_of, quota_listing, training_quotas

    from btk.catalog import get_environment
    from btk.doctor.quotas import instance_quota_name

    with fixture_catalog.installed():
        env = get_environment(SAMPLE_ENV)
        jobs = jobs_of(env)
        aws = healthy_account(env, jobs, deployed=False)
        name = instance_quota_name(env.instance_type, spot=False)
        applied = {key: value for key, value in training_quotas(env, jobs).items() if key != name}
        aws.answers[("service-quotas", "ListServiceQuotas")] = by_service(
            {"sagemaker": quota_listing(applied, "sagemaker"), "fsx": quota_listing(fsx_quotas(), "fsx")}
        )
        code, lines = doctor(SAMPLE_ENV, aws)
    return "```text\n$ btk doctor --env staging\n" + "\n".join(lines) + f"\n$ echo $?\n{code}\n```\n"


def block_pattern() -> re.Pattern[str]:
    return re.compile(rf"(<!-- generated:{MARKER} -->\n)(.*?)(<!-- /generated:{MARKER} -->)", re.DOTALL)


def current_sample(text: str) -> str:
    match = block_pattern().search(text)
    return match.group(2) if match else ""


def main() -> None:
    text = DOC.read_text()
    body = sample()
    text, count = block_pattern().subn(lambda m: m.group(1) + body + m.group(3), text)
    if count != 1:
        raise SystemExit(f"docs/deploy.md: marker generated:{MARKER} missing")
    DOC.write_text(text)


if __name__ == "__main__":
    sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "tests" / "doctor")]
    main()
