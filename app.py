#!/usr/bin/env python3
"""CDK entry point: pick the environment, validate it, build TrainingStack.

    npx cdk synth TrainingStack -c env=staging [-c account=... -c region=... -c availability_zone=...]

The environment comes from ``environments.py`` (``-c env=``, default
``environments.DEFAULT_ENVIRONMENT``). Real account ids come from context or CI variables,
never from the repository. Any configuration error prints one line and exits with 2
before a single construct is built; cdk-nag's AwsSolutions pack runs on every synth and
an unacknowledged finding fails it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from btk.catalog import all_environments, get_environment, get_profile
from btk.environment import EnvironmentConfig
from btk.errors import BtkError, one_line

#: Context keys that override a field of the selected environment (values are strings).
OVERRIDABLE = ("account", "region", "availability_zone")
#: Exit code for a configuration error, as for every ``btk`` user error.
CONFIG_ERROR_EXIT = 2


def validate_environment(name: str, values: Mapping[str, Any]) -> EnvironmentConfig:
    """Validate ``values`` as environment ``name``, then each profile name; one-line errors."""
    try:
        config = EnvironmentConfig.model_validate(dict(values))
    except ValidationError as error:
        raise BtkError(f"environment {name}: {one_line(error)}") from None
    for profile in config.profiles:
        try:
            get_profile(profile)
        except BtkError as error:
            raise BtkError(f"environment {name}: profiles: {error}") from None
    return config


def load_environment(context: Mapping[str, Any]) -> EnvironmentConfig:
    """The environment selected by CDK context (``env``, ``account``, ``region``, ``availability_zone``)."""
    try:
        import environments

        default = environments.DEFAULT_ENVIRONMENT
        all_environments()
    except ValidationError as error:
        raise BtkError(f"environments.py: {one_line(error)}") from None
    name = str(context.get("env") or default)
    base = get_environment(name)
    values = base.model_dump()
    for key in OVERRIDABLE:
        override = context.get(key)
        if override is not None and str(override) != "":
            values[key] = str(override)
    raw = context.get("profiles")
    if raw:
        values["profiles"] = tuple(raw.split(",")) if isinstance(raw, str) else tuple(raw)
    return validate_environment(name, values)


def cli_context() -> dict[str, Any]:
    """The context the CDK CLI hands the app (``-c`` values, cdk.json, cdk.context.json).

    Read from the environment so a bad configuration is reported before aws_cdk (and the
    Node.js runtime behind it) starts: the error stays one line.
    """
    context: dict[str, Any] = {}
    overflow = os.environ.get("CONTEXT_OVERFLOW_LOCATION_ENV")
    if overflow and os.path.isfile(overflow):
        with open(overflow, encoding="utf-8") as handle:
            context.update(json.load(handle))
    raw = os.environ.get("CDK_CONTEXT_JSON")
    if raw:
        context.update(json.loads(raw))
    return context


def build_app(context: Mapping[str, Any] | None = None, *, outdir: str | None = None) -> Any:
    """Validate the environment from ``context``, then build the app with cdk-nag applied.

    ``context`` defaults to the CDK CLI's context (``-c key=value``). Raises ``BtkError``
    before any construct exists (before aws_cdk is even imported) if the configuration is
    invalid.
    """
    env_config = load_environment(cli_context() if context is None else context)

    from aws_cdk import App

    app = App(outdir=outdir, analytics_reporting=False)

    from stacks.training_stack import TrainingStack
    from training_constructs.nag import apply_nag

    TrainingStack(app, "TrainingStack", env_config=env_config)
    # CiAccessStack (GitHub OIDC roles) is added only with `-c ci_access=true`: docs/ci.md.
    from stacks.ci_access_stack import add_ci_access_stack

    add_ci_access_stack(app, list(all_environments().values()), context)
    apply_nag(app)
    return app


def main() -> int:
    try:
        app = build_app()
    except BtkError as error:
        print(f"btk: error: {error}", file=sys.stderr)
        return CONFIG_ERROR_EXIT
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
