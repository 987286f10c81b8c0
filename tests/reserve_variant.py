"""A catalog environment turned into ``reserve`` mode, synthesized as app.py would (cdk-nag on).

The permission check and the deploy-readiness tests need a template whose training plan is
bought at deploy; the user's environments may all be on-demand, so one is derived here.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from btk.environment import EnvironmentConfig, ReservePlanCapacity

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

#: Plan sizes the API sells (btk.environment checks the same list).
PLAN_INSTANCE_COUNTS = (1, 2, 4, 8, 16, 32, 64)


def reserve_environment(env: EnvironmentConfig, start_after: datetime) -> EnvironmentConfig:
    """``env`` buying a one-week plan from ``start_after`` for its instance count, approved, fee ceiling set."""
    count = next(n for n in PLAN_INSTANCE_COUNTS if n >= env.instance_count)
    values = env.model_dump()
    values["capacity"] = ReservePlanCapacity(
        start_after=start_after, duration_hours=168, instance_count=count, max_upfront_fee=250_000,
        purchase_approved=True,
    )
    values["managed_spot"] = False
    return EnvironmentConfig.model_validate(values)


def synthesize_environment(env: EnvironmentConfig, outdir: Path | None = None) -> dict[str, Any]:
    """TrainingStack of ``env`` with cdk-nag (an unacknowledged finding raises); the template."""
    from aws_cdk import App, DefaultStackSynthesizer

    from app import project_context
    from stacks.training_stack import TrainingStack
    from training_constructs.nag import apply_nag

    with tempfile.TemporaryDirectory(prefix=f"btk-{env.name}-") as scratch:
        out = outdir or Path(scratch)
        # As app.py: the environment's own bootstrap (its qualifier names the asset bucket and repository).
        synthesizer = DefaultStackSynthesizer(qualifier=env.bootstrap_qualifier)
        app = App(outdir=str(out), default_stack_synthesizer=synthesizer, context=project_context())  # cdk.json's
        apply_nag(app)
        stack = TrainingStack(app, "TrainingStack", env_config=env)
        app.synth()
        template: dict[str, Any] = json.loads((out / f"{stack.artifact_id}.template.json").read_text())
    return template


def synthesize_boundary(env: EnvironmentConfig, environments: Sequence[EnvironmentConfig]) -> dict[str, Any]:
    """``env``'s permissions boundary (stacks/boundary_stack.py) with cdk.json's context and cdk-nag; its
    neighbours are the other ``environments`` of its account (``env`` itself may be a variant of one of them)."""
    from aws_cdk import App

    from app import project_context
    from btk.environment import job_log_groups_owner
    from stacks.boundary_stack import EnvironmentBoundaryProps, EnvironmentBoundaryStack
    from training_constructs.nag import apply_nag

    neighbours = [other for other in environments if other.name != env.name and other.account == env.account]
    owns = job_log_groups_owner(environments, env) == env.name
    with tempfile.TemporaryDirectory(prefix=f"btk-boundary-{env.name}-") as out:
        app = App(outdir=out, context=project_context())
        apply_nag(app)
        stack = EnvironmentBoundaryStack(app, f"BtkBoundary-{env.name}", props=EnvironmentBoundaryProps(
            environment=env, neighbours=neighbours, owns_job_log_groups=owns))
        app.synth()
        template: dict[str, Any] = json.loads((Path(out) / f"{stack.artifact_id}.template.json").read_text())
    return template
