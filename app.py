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

import atexit
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

from pydantic import ValidationError

from btk.bootstrap import BOUNDARY_CONTEXT
from btk.catalog import (
    ENVIRONMENTS,
    ENVIRONMENTS_FILE,
    PROFILES,
    PROJECT_ROOT,
    all_environments,
    all_profiles,
    default_environment_name,
    environment_error,
    get_environment,
    get_profile,
)
from btk.environment import EnvironmentConfig
from btk.errors import BtkError
from btk.hardware import INSTANCE_TYPES

#: Context keys that override a field of the selected environment (values are strings).
OVERRIDABLE = ("account", "region", "availability_zone", "image_uri")
#: Exit code for a configuration error, as for every ``btk`` user error.
CONFIG_ERROR_EXIT = 2


def validate_environment(name: str, values: Mapping[str, Any], source: str = ENVIRONMENTS_FILE) -> EnvironmentConfig:
    """Validate ``values`` as environment ``name``, then each profile name; one-line errors.

    ``source`` says where the values came from (the file, and any ``-c`` overrides).
    """
    try:
        config = EnvironmentConfig.model_validate(dict(values))
    except ValidationError as error:
        raise environment_error(name, error, source) from None
    # The catalog's types are all in botocore's list (tests/core/test_config_errors.py); reading
    # botocore's SageMaker model for others (0.2 s) names a type SageMaker does not train on.
    if config.instance_type not in INSTANCE_TYPES and config.instance_type not in training_instance_types():
        raise BtkError(
            f"{source}: environment {name!r}: instance_type: {config.instance_type} is not a SageMaker training "
            "instance type (botocore's TrainingInstanceType)"
        )
    all_profiles()  # a broken profiles/ module reports itself, not as this environment's fault
    for profile in config.profiles:
        try:
            get_profile(profile)
        except BtkError as error:
            raise BtkError(f"{source}: environment {name!r}: profiles: {error}") from None
    return config


def training_instance_types() -> tuple[str, ...]:
    """Instance types SageMaker training jobs accept, from botocore's service model (offline)."""
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    return tuple(model.shape_for("TrainingInstanceType").enum)


def load_environment(context: Mapping[str, Any]) -> EnvironmentConfig:
    """The environment selected by CDK context (``env``, ``account``, ``region``, ``availability_zone``)."""
    name = str(context.get("env") or default_environment_name())
    values = get_environment(name).model_dump()
    overrides: dict[str, Any] = {}
    for key in OVERRIDABLE:
        override = context.get(key)
        if override is not None and str(override) != "":
            overrides[key] = str(override)
    raw = context.get("profiles")
    if raw:
        overrides["profiles"] = tuple(raw.split(",")) if isinstance(raw, str) else tuple(raw)
    source = ENVIRONMENTS_FILE + "".join(f" with -c {key}={_context_text(value)}" for key, value in overrides.items())
    return validate_environment(name, {**values, **overrides}, source)


def _context_text(value: Any) -> str:
    return ",".join(value) if isinstance(value, tuple) else str(value)


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


def project_context() -> dict[str, Any]:
    """The context the CDK CLI reads from the project (cdk.json's ``context``, then cdk.context.json).

    An app built in-process (tests, ``btk``) gets the same feature flags and validation as one the
    CLI runs.
    """
    here = Path(__file__).resolve().parent
    context: dict[str, Any] = {}
    for name, key in (("cdk.json", "context"), ("cdk.context.json", None)):
        path = here / name
        if path.is_file():
            data = json.loads(path.read_text(encoding="utf-8"))
            context.update(data.get(key, {}) if key else data)
    return context


REQUIRE_REHEARSAL_CONTEXT = "require_rehearsal"
"""``-c require_rehearsal=true``: a deploy that buys a training plan refuses while a profile is unrehearsed."""


def context_flag(key: str, value: object) -> bool:
    """A boolean CDK context value: ``true``/``false`` as text (``-c key=true``) or JSON (cdk.json); one line else."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise BtkError(f"-c {key}={value}: give true or false")


def refuse_an_unrehearsed_purchase(env_config: EnvironmentConfig, context: Mapping[str, Any]) -> None:
    """With ``-c require_rehearsal=true``, an environment that buys its training plan at deploy (``capacity`` mode
    ``reserve``) synthesizes only if the team's evidence store holds a measured run of each profile's model on its
    instance type (``BTK_EVIDENCE``, else ``btk-evidence.json`` here); one line naming every other profile else.
    Without the flag the plan ``make synth`` prints says ``rehearsed``/``not rehearsed`` for each."""
    from btk.evidence import evidence_path, read_evidence
    from btk.planner.evidence import refuse_unrehearsed_purchase

    flag = context.get(REQUIRE_REHEARSAL_CONTEXT)
    if flag is None or str(flag) == "" or not context_flag(REQUIRE_REHEARSAL_CONTEXT, flag):
        return
    if env_config.capacity.mode != "reserve":
        return  # nothing is bought at deploy
    store = evidence_path()
    profiles = [(name, get_profile(name).architecture) for name in env_config.profiles]
    refuse_unrehearsed_purchase(env_config.name, profiles, env_config.instance_type, read_evidence(store), store)


def build_app(context: Mapping[str, Any] | None = None, *, outdir: str | None = None) -> Any:
    """Validate the environment from ``context``, then build the app with cdk-nag applied.

    ``context`` defaults to the CDK CLI's context (``-c key=value``); one given here is added to
    the project's (:func:`project_context`), as the CLI adds ``-c`` values. Raises ``BtkError``
    before any construct exists (before aws_cdk is even imported) if the configuration is
    invalid. With ``-c boundary=<env>`` the app holds that environment's permissions boundary
    alone (``BtkBoundary-<env>``, deployed before ``cdk bootstrap``: docs/deploy.md).
    """
    from_cli = context is None
    context = cli_context() if context is None else {**project_context(), **context}
    app_context = None if from_cli else dict(context)
    env_config = load_environment(context)
    refuse_an_unrehearsed_purchase(env_config, context)
    from stacks.boundary_stack import add_boundary_stack
    from training_constructs.nag import apply_nag

    if context.get(BOUNDARY_CONTEXT):
        from aws_cdk import App

        app = App(outdir=outdir, analytics_reporting=False, context=app_context)
        add_boundary_stack(app, list(all_environments().values()), context)
        apply_nag(app)
        return app
    from training_constructs import definition_worker

    definition_worker.prepare(env_config.region)  # a no-op unless main() started the worker

    from aws_cdk import App, DefaultStackSynthesizer

    # The environment's own bootstrap (cdk bootstrap --qualifier): its CI role may assume only
    # that bootstrap's roles, so it cannot deploy through another environment's (docs/ci.md).
    synthesizer = DefaultStackSynthesizer(qualifier=env_config.bootstrap_qualifier)
    app = App(outdir=outdir, analytics_reporting=False, default_stack_synthesizer=synthesizer, context=app_context)

    from btk.environment import job_log_groups_owner
    from stacks.training_stack import TrainingStack

    # SageMaker's job log groups are account-wide: one environment of the account and region owns them,
    # judged on environments.py as written (as the boundaries are: -c overrides apply to every environment).
    catalog = all_environments()
    owner = job_log_groups_owner(list(catalog.values()), catalog[env_config.name])
    TrainingStack(app, "TrainingStack", env_config=env_config, owns_job_log_groups=owner == env_config.name)
    # CiAccessStack (GitHub OIDC roles) is added only with `-c ci_access=true`: docs/ci.md.
    from stacks.ci_access_stack import add_ci_access_stack

    add_ci_access_stack(app, list(all_environments().values()), context)
    apply_nag(app)
    return app


def user_config_paths() -> tuple[Path, ...]:
    """The user's ``environments.py`` and ``profiles/``, which shape the app's pipeline definitions."""
    return tuple(PROJECT_ROOT / user.path for user in (ENVIRONMENTS, PROFILES))


def main() -> int:
    from training_constructs import definition_worker
    from training_constructs.definition_cache import CACHE_ENV, default_directory, record_run, run_key, run_stored

    # Unchanged pipeline definitions are read back instead of importing the SageMaker SDK again; where a run
    # of the same inputs may need one that is not stored, a worker imports the SDK on another core meanwhile.
    # The boundary's app (-c boundary=<env>) builds no pipeline.
    os.environ.setdefault(CACHE_ENV, str(default_directory()))
    try:
        context = cli_context()
        run = run_key(context, user_config_paths())
        if not context.get(BOUNDARY_CONTEXT) and not run_stored(run):
            definition_worker.start()
        app = build_app()
    except BtkError as error:
        print(f"btk: error: {error}", file=sys.stderr)
        return CONFIG_ERROR_EXIT
    finally:
        definition_worker.stop()
    record_run(run)
    app.synth()
    return 0


def exit_without_teardown(status: int) -> NoReturn:
    """Leave with ``status`` after the exit handlers, skipping the interpreter's teardown.

    Once ``app.synth()`` returns, the cloud assembly is on disk and the exit handlers stop the
    jsii kernel (its Node.js process). What remains is freeing every object of the
    interpreter, the SageMaker SDK's thousands of pydantic model classes among them: about
    1.5 s of a whole-app synth that produces nothing.
    """
    atexit._run_exitfuncs()  # the handlers sys.exit would run: jsii stops its kernel
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    exit_without_teardown(main())
