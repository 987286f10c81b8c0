"""CiAccessStack: who can assume each role (trust) and what each role can do (policy).

Machinery: the stack is built for the fixture environments (``tests/fixture_catalog.py``);
only the slow ``cdk synth`` check goes through ``app.py`` with the user's ``environments.py``.
"""

from __future__ import annotations

from typing import Any

import fixture_catalog as fc
import pytest
from aws_cdk import Environment
from stack_synth import cli_app

from app import project_context
from btk.bootstrap import boundary_policy_name
from btk.catalog import all_environments, default_environment_name, get_environment
from btk.environment import EnvironmentConfig
from btk.errors import BtkError
from stacks.ci_access_stack import (
    BOOTSTRAP_ROLE_KINDS,
    DIFF_ACTIONS,
    CiAccessProps,
    CiAccessStack,
    add_ci_access_stack,
    ci_access_props_from_context,
)
from training_constructs.nag import apply_nag

ACCOUNT = "123456789012"
REPO = "acme-ml/blackwell-training-kit"
OIDC = "token.actions.githubusercontent.com"
PROVIDER_ARN = f"arn:aws:iam::{ACCOUNT}:oidc-provider/{OIDC}"
#: The fixture dev / staging / prod ladder the stack is built for.
ENVIRONMENTS = tuple(fc.ENVIRONMENTS.values())


def synth(props: CiAccessProps) -> dict[str, Any]:
    """Synthesize CiAccessStack with cdk-nag's AwsSolutions pack (an unacknowledged finding raises)."""
    app = cli_app(context={"aws:cdk:version-reporting": False})
    CiAccessStack(app, "CiAccessStack", props=props, env=Environment(account=ACCOUNT, region="us-east-1"))
    apply_nag(app)
    template: dict[str, Any] = app.synth().get_stack_by_name("CiAccessStack").template
    return template


def resolve(value: Any) -> Any:
    """Resolve the pseudo parameters and joins CDK emits for ARNs into plain strings."""
    if isinstance(value, dict) and "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(str(resolve(part)) for part in parts)
    if value == {"Ref": "AWS::Partition"}:
        return "aws"
    if value == {"Ref": "AWS::AccountId"}:
        return ACCOUNT
    if isinstance(value, list):
        return [resolve(v) for v in value]
    return value


def of_type(template: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == kind}


def role_named(template: dict[str, Any], name: str) -> tuple[str, dict[str, Any]]:
    (match,) = [(k, v["Properties"]) for k, v in of_type(template, "AWS::IAM::Role").items()
                if v["Properties"]["RoleName"] == name]
    return match


def policies_of(template: dict[str, Any], logical_id: str) -> list[dict[str, Any]]:
    """Every AWS::IAM::Policy attached to the role ``logical_id``."""
    return [p["Properties"] for p in of_type(template, "AWS::IAM::Policy").values()
            if {"Ref": logical_id} in p["Properties"]["Roles"]]


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return synth(CiAccessProps(environments=ENVIRONMENTS, github_repo=REPO))


def test_creates_the_github_oidc_provider_for_sts(template: dict[str, Any]) -> None:
    (provider,) = of_type(template, "AWS::IAM::OIDCProvider").values()
    assert provider["Properties"]["Url"] == f"https://{OIDC}"
    assert provider["Properties"]["ClientIdList"] == ["sts.amazonaws.com"]


@pytest.mark.parametrize("env", ENVIRONMENTS, ids=lambda e: e.name)
def test_deploy_role_trusts_only_this_repository_and_environment(template: dict[str, Any], env: Any) -> None:
    _, role = role_named(template, f"btk-github-deploy-{env.name}")
    (statement,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert statement["Effect"] == "Allow"
    assert statement["Action"] == "sts:AssumeRoleWithWebIdentity"
    assert statement["Principal"] == {"Federated": {"Ref": next(iter(of_type(template, "AWS::IAM::OIDCProvider")))}}
    assert statement["Condition"] == {
        "StringEquals": {f"{OIDC}:aud": "sts.amazonaws.com", f"{OIDC}:sub": f"repo:{REPO}:environment:{env.name}"}
    }
    assert role["MaxSessionDuration"] == 7200


@pytest.mark.parametrize("env", ENVIRONMENTS, ids=lambda e: e.name)
def test_deploy_role_can_only_assume_the_cdk_bootstrap_roles(template: dict[str, Any], env: Any) -> None:
    logical_id, role = role_named(template, f"btk-github-deploy-{env.name}")
    assert "ManagedPolicyArns" not in role and "Policies" not in role
    # Bounded as every other role of its environment (stacks/boundary_stack.py).
    assert resolve(role["PermissionsBoundary"]) == f"arn:aws:iam::{ACCOUNT}:policy/{boundary_policy_name(env)}"
    assert of_type(template, "AWS::IAM::ManagedPolicy") == {}
    (policy,) = policies_of(template, logical_id)
    (statement,) = policy["PolicyDocument"]["Statement"]
    assert statement["Effect"] == "Allow"
    assert statement["Action"] == "sts:AssumeRole"
    assert "NotAction" not in statement and "NotResource" not in statement and "Condition" not in statement
    assert sorted(resolve(as_list(statement["Resource"]))) == sorted(
        f"arn:aws:iam::{ACCOUNT}:role/cdk-{env.bootstrap_qualifier}-{kind}-role-{ACCOUNT}-{env.region}"
        for kind in BOOTSTRAP_ROLE_KINDS
    )


def test_no_two_deploy_roles_may_assume_the_same_bootstrap_role(template: dict[str, Any]) -> None:
    assumable: dict[str, set[str]] = {}
    for env in ENVIRONMENTS:
        logical_id, _ = role_named(template, f"btk-github-deploy-{env.name}")
        (policy,) = policies_of(template, logical_id)
        (statement,) = policy["PolicyDocument"]["Statement"]
        assumable[env.name] = set(resolve(as_list(statement["Resource"])))
    for name, arns in assumable.items():
        others = set().union(*(other for other_name, other in assumable.items() if other_name != name))
        assert arns.isdisjoint(others), name


def test_diff_role_trusts_pull_requests_and_only_reads_training_stack_templates(template: dict[str, Any]) -> None:
    logical_id, role = role_named(template, "btk-github-diff")
    (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
    # Pull requests, and the deploy workflow's diff on main (no GitHub Environment: shown before approval).
    assert trust["Condition"]["StringEquals"][f"{OIDC}:sub"] == [
        f"repo:{REPO}:pull_request", f"repo:{REPO}:ref:refs/heads/main"
    ]
    assert "ManagedPolicyArns" not in role
    (policy,) = policies_of(template, logical_id)
    (statement,) = policy["PolicyDocument"]["Statement"]
    assert sorted(as_list(statement["Action"])) == sorted(DIFF_ACTIONS)
    assert not any(a.startswith("sts:") for a in as_list(statement["Action"]))
    expected = []
    for env in ENVIRONMENTS:
        base = f"arn:aws:cloudformation:{env.region}:{ACCOUNT}:stack/{env.stack_name}"
        expected += [f"{base}/*", f"{base}-*/*"]
    assert sorted(resolve(as_list(statement["Resource"]))) == sorted(expected)


def test_outputs_name_where_each_arn_goes(template: dict[str, Any]) -> None:
    descriptions = [o["Description"] for o in template["Outputs"].values()]
    for env in ENVIRONMENTS:
        assert f"Set as variable DEPLOY_ROLE_ARN of GitHub Environment {env.name}" in descriptions
    assert any("DEV_DIFF_ROLE_ARN, STAGING_DIFF_ROLE_ARN, PROD_DIFF_ROLE_ARN" in d for d in descriptions)


def test_an_existing_provider_is_imported_not_created() -> None:
    template = synth(CiAccessProps(environments=ENVIRONMENTS[:1], existing_provider_arn=PROVIDER_ARN,
                                   diff_role=False))
    assert of_type(template, "AWS::IAM::OIDCProvider") == {}
    (role,) = of_type(template, "AWS::IAM::Role").values()
    (statement,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert statement["Principal"] == {"Federated": PROVIDER_ARN}
    assert statement["Condition"]["StringEquals"][f"{OIDC}:sub"] == (
        "repo:example-org/blackwell-training-kit:environment:dev"
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"environments": ()}, "CiAccessProps.environments is empty"),
        ({"github_repo": "just-a-name"}, "github_repo 'just-a-name' is not OWNER/NAME: pass -c github_repo="),
        ({"existing_provider_arn": "arn:aws:iam::123:oidc-provider/x"}, "is not a GitHub OIDC provider ARN"),
        ({"role_name_prefix": "has space"}, "role_name_prefix 'has space' is not usable in a role name"),
        ({"environments": (fc.DEV, fc.DEV)}, "lists an environment twice: dev, dev"),
    ],
)
def test_bad_props_fail_with_one_line_naming_the_field(overrides: dict[str, Any], message: str) -> None:
    values: dict[str, Any] = {"environments": ENVIRONMENTS, **overrides}
    with pytest.raises(BtkError, match=message.replace("(", r"\(")) as error:
        CiAccessProps(**values)
    assert "\n" not in str(error.value)


def _env(name: str, **values: Any) -> EnvironmentConfig:
    return EnvironmentConfig.model_validate(
        {"name": name, "availability_zone": "us-east-1a", "profiles": (fc.LLAMA_1B.name,), **values}
    )


def test_each_environment_gets_its_own_bootstrap_qualifier_by_default() -> None:
    assert [_env(name).bootstrap_qualifier for name in ("dev", "staging", "prod", "eu-train-42")] == [
        "btkdev", "btkstaging", "btkprod", "btkeutrain"
    ]
    assert _env("prod", bootstrap_qualifier="hnb659fds").bootstrap_qualifier == "hnb659fds"


@pytest.mark.parametrize("qualifier", ["Not_Valid", "", "elevenchars", "has-dash"])
def test_a_bad_bootstrap_qualifier_is_one_line_naming_the_field(qualifier: str) -> None:
    from app import validate_environment

    values = _env("qa").model_dump() | {"bootstrap_qualifier": qualifier}
    with pytest.raises(BtkError, match=r"environment 'qa': bootstrap_qualifier: must be 1-10 lower-case") as error:
        validate_environment("qa", values)
    assert "\n" not in str(error.value)


def test_environments_sharing_region_and_qualifier_are_refused() -> None:
    shared = (_env("dev", bootstrap_qualifier="hnb659fds"), _env("prod", bootstrap_qualifier="hnb659fds"))
    with pytest.raises(BtkError, match="environments 'dev' and 'prod' share bootstrap_qualifier 'hnb659fds' in "
                                       "us-east-1: either CI role could deploy both") as error:
        CiAccessProps(environments=shared)
    assert "\n" not in str(error.value)
    # Long names cut to the same default qualifier collide too.
    with pytest.raises(BtkError, match="share bootstrap_qualifier 'btktrainin'"):
        CiAccessProps(environments=(_env("training-a"), _env("training-b")))
    # Another region has its own bootstrap: no conflict.
    CiAccessProps(environments=(shared[0], _env("prod", region="eu-west-1", availability_zone="eu-west-1a",
                                                bootstrap_qualifier="hnb659fds")))


def test_ci_access_stack_deploys_with_the_callers_credentials_through_no_bootstrap() -> None:
    """An environment's bootstrap roles may reach only that environment's stack: the CLI must deploy this
    stack as the person running it, assuming no role and reading no bootstrap version."""
    app = cli_app(context=project_context())
    stack = CiAccessStack(app, "CiAccessStack", props=CiAccessProps(environments=ENVIRONMENTS),
                          env=Environment(account=ACCOUNT, region="us-east-1"))
    artifact = app.synth().get_stack_by_name(stack.stack_name)
    assert "BootstrapVersion" not in artifact.template.get("Parameters", {})
    assert artifact.assume_role_arn is None and artifact.cloud_formation_execution_role_arn is None


def test_context_turns_the_stack_on_and_selects_environments() -> None:
    assert ci_access_props_from_context({}, ENVIRONMENTS) is None
    assert ci_access_props_from_context({"ci_access": "false"}, ENVIRONMENTS) is None
    chosen = [env.name for env in ENVIRONMENTS[-2:]]
    props = ci_access_props_from_context(
        {"ci_access": "true", "ci_environments": ", ".join(chosen), "github_repo": REPO,
         "github_oidc_provider_arn": PROVIDER_ARN},
        ENVIRONMENTS,
    )
    assert props is not None
    assert [env.name for env in props.environments] == chosen
    assert props.github_repo == REPO and props.existing_provider_arn == PROVIDER_ARN
    with pytest.raises(BtkError, match=r"ci_environments names unknown environment\(s\) qa: use names from"):
        context = {"ci_access": "true", "ci_environments": f"{fc.DEV.name},qa"}
        ci_access_props_from_context(context, ENVIRONMENTS)


def test_the_app_only_gets_the_stack_when_asked() -> None:
    assert add_ci_access_stack(cli_app(), ENVIRONMENTS) is None
    app = cli_app(context={"ci_access": "true", "github_repo": REPO, "account": ACCOUNT})
    stack = add_ci_access_stack(app, ENVIRONMENTS)
    assert stack is not None and stack.account == ACCOUNT
    assert sorted(stack.deploy_roles) == sorted(env.name for env in ENVIRONMENTS)


@pytest.mark.slow
def test_cdk_app_adds_the_stack_only_with_ci_access_context(tmp_path: Any) -> None:
    """`cdk synth CiAccessStack -c ci_access=true ...` goes through app.build_app, cdk-nag included."""
    from app import build_app

    default = default_environment_name()
    context = {"env": default, "ci_access": "true", "github_repo": REPO}
    app = build_app(context, outdir=str(tmp_path / "on"))
    assembly = app.synth()  # cdk-nag runs over both stacks; an unacknowledged finding raises
    template = assembly.get_stack_by_name("CiAccessStack").template
    assert len(of_type(template, "AWS::IAM::Role")) == len(all_environments()) + 1

    app = build_app({"env": default}, outdir=str(tmp_path / "off"))
    assert app.node.try_find_child("CiAccessStack") is None
    assert app.node.try_find_child("TrainingStack") is not None
    # TrainingStack deploys through its environment's own bootstrap (roles, bucket, repository).
    env = get_environment(default)
    training = assembly.get_stack_by_name(env.stack_name).template
    assert training["Parameters"]["BootstrapVersion"]["Default"] == f"/cdk-bootstrap/{env.bootstrap_qualifier}/version"
