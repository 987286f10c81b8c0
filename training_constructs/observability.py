"""Observability of one environment's training: dashboard, failure events, notifications.

* A CloudWatch dashboard ``btk-<env>-training``: per profile, the trainer's metrics
  (``btk.metrics``) as SageMaker publishes them (namespace ``/aws/sagemaker/TrainingJobs``,
  dimension ``TrainingJobName``; found by the profile's job-name prefix with a SEARCH
  expression, since pipeline jobs get a run-time suffix), and the pipelines' execution
  outcomes (``AWS/Sagemaker/ModelBuildingPipeline`` ``ExecutionSucceeded``/``ExecutionFailed``
  by ``PipelineName``), plus a Logs Insights table of the latest metric lines.
* An EventBridge rule for failed executions of this environment's pipelines: an execution
  fails once a job fails for a reason the pipeline does not retry, or its last retry fails,
  so a retried attempt never alerts (see the comment at the rule for why there is no
  job-level rule). It notifies an SNS topic (SSL only, KMS encrypted with a dedicated key
  whose policy lets EventBridge use it) and is recorded in a KMS-encrypted log group with
  the environment's retention.

Targets are bound directly (no CDK custom resource): the topic policy and the log group's
resource policy allow ``events.amazonaws.com`` for exactly these rules.

SageMaker writes job logs to the account-wide groups ``/aws/sagemaker/TrainingJobs`` and
``/aws/sagemaker/ProcessingJobs``, which it creates on first use with no expiry and no key;
:class:`~training_constructs.job_logs.SageMakerJobLogGroups` adopts them (created if missing)
with the environment's retention and key, unless ``manage_sagemaker_log_groups`` is off.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

import jsii
from aws_cdk import ArnFormat, Duration, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from btk.environment import EnvironmentConfig
from btk.metrics import METRICS_BY_KEY
from btk.naming import environment_prefix
from training_constructs.data_stage import account_log_groups_condition
from training_constructs.job_logs import SageMakerJobLogGroups, SageMakerJobLogGroupsProps
from training_constructs.removal import data_removal_policy, stack_generation
from training_constructs.sagemaker_service import (
    PIPELINE_METRIC_NAMESPACE,
    TRAINING_JOB_LOG_GROUP,
    TRAINING_METRIC_DIMENSION,
    TRAINING_METRIC_NAMESPACE,
)

PIPELINE_FAILED_DETAIL_TYPE = "SageMaker Model Building Pipeline Execution Status Change"
#: Metrics drawn per profile, one graph each.
DASHBOARD_METRICS = (
    "loss", "tokens_per_second_per_gpu", "tflops_per_gpu", "mfu", "peak_memory_gib", "allreduce_busbw_gbps",
)


@dataclass(frozen=True)
class TrainingObservabilityProps:
    """Props of :class:`TrainingObservability`.

    :param environment: the environment (name, region, account, log retention).
    :param key: the key of the topic and the log groups; if it is a ``kms.Key`` of this app,
        statements letting EventBridge and CloudWatch Logs use it are added to its policy.
        Default: a dedicated key with rotation.
    :param pipeline_names: the environment's pipeline names (``btk-<env>-<profile>``).
    :param job_name_prefixes: job-name prefix by profile name (``TrainingPipeline.job_name_prefix``), for
        the dashboard's per-profile metric graphs.
    :param notification_emails: e-mail addresses subscribed to the topic. Default: none.
    :param manage_sagemaker_log_groups: put SageMaker's account-wide job log groups under this
        environment's retention and key (created if missing, never deleted). Default: True.
    :param metric_period: period of the dashboard's metric graphs. Default: 1 minute.
    """

    environment: EnvironmentConfig
    pipeline_names: Sequence[str]
    job_name_prefixes: Mapping[str, str]
    key: kms.IKey | None = None
    notification_emails: Sequence[str] = field(default_factory=tuple)
    manage_sagemaker_log_groups: bool = True
    metric_period: Duration = field(default_factory=lambda: Duration.minutes(1))


@jsii.implements(events.IRuleTarget)
class _DirectTarget:
    """Binds a rule to a target ARN; the target's resource policy is written by the caller."""

    def __init__(self, arn: str) -> None:
        self.arn = arn

    def bind(self, rule: events.IRule, id: str | None = None) -> events.RuleTargetConfig:
        return events.RuleTargetConfig(arn=self.arn)


class TrainingObservability(Construct):
    """Dashboard, failure rules, SNS topic and event log group of one environment.

    Attributes: ``key``, ``topic``, ``event_log_group``, ``pipeline_failed_rule``,
    ``dashboard``, ``job_logs`` (None when ``manage_sagemaker_log_groups`` is off).
    """

    def __init__(self, scope: Construct, construct_id: str, *, props: TrainingObservabilityProps) -> None:
        super().__init__(scope, construct_id)
        self._validate_props(props)
        env = props.environment
        stack = Stack.of(self)
        self.environment = env
        removal = data_removal_policy(env.retain_data)

        self.key: kms.IKey = props.key or kms.Key(
            self,
            "Key",
            description=f"Blackwell Training Kit notifications and event logs ({env.name})",
            enable_key_rotation=True,
            removal_policy=removal,
        )
        if isinstance(self.key, kms.Key):
            self._allow_services(self.key, stack)

        self.topic = sns.Topic(
            self,
            "Topic",
            display_name=f"btk {env.name} training failures",
            master_key=self.key,
            enforce_ssl=True,
        )
        for email in props.notification_emails:
            self.topic.add_subscription(subscriptions.EmailSubscription(email))

        self.event_log_group = logs.LogGroup(
            self,
            "EventLog",
            # The generation keeps a group retained by a destroyed stack from blocking the next deploy.
            log_group_name=f"/btk/{env.name}/training-events-{stack_generation(stack)}",
            encryption_key=self.key,
            removal_policy=removal,
        )
        _set_retention(self.event_log_group, env.log_retention_days)
        self.job_logs: SageMakerJobLogGroups | None = None
        if props.manage_sagemaker_log_groups:
            caller_logs = logs.LogGroup(self, "JobLogGroupsCallerLogs", encryption_key=self.key, removal_policy=removal)
            _set_retention(caller_logs, env.log_retention_days)
            self.job_logs = SageMakerJobLogGroups(
                self,
                "JobLogGroups",
                props=SageMakerJobLogGroupsProps(
                    key=self.key, retention_days=env.log_retention_days, handler_log_group=caller_logs
                ),
            )

        self.pipeline_arns = [
            stack.format_arn(service="sagemaker", resource="pipeline", resource_name=name)
            for name in props.pipeline_names
        ]
        self.pipeline_failed_rule = events.Rule(
            self,
            "PipelineFailed",
            description=f"A {env.name} training pipeline execution failed",
            event_pattern=events.EventPattern(
                source=["aws.sagemaker"],
                detail_type=[PIPELINE_FAILED_DETAIL_TYPE],
                detail={"currentPipelineExecutionStatus": ["Failed"], "pipelineArn": self.pipeline_arns},
            ),
        )
        # No rule on "SageMaker Training Job State Change": every job of the environment is a
        # step of its pipelines, and a job that fails is either retried (capacity or internal
        # error: not news until the last attempt fails) or fails its step and so the execution,
        # which the rule above reports once. A job rule cannot tell the two apart: the event
        # carries no attempt number, and one pattern cannot exclude both retried FailureReason
        # classes (EventBridge's anything-but takes a single prefix). It would alert twice for a
        # final failure and once per retried attempt. `btk report` lists every attempt's cause.
        rules = [self.pipeline_failed_rule]
        # A log-group target is the group's ARN without the ":*" that LogGroup.log_group_arn
        # carries (aws-events-targets' CloudWatchLogGroup builds it the same way); with it the
        # rule deploys but EventBridge delivers nothing.
        self.event_log_target_arn = stack.format_arn(
            service="logs", resource="log-group", resource_name=self.event_log_group.log_group_name,
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        for rule in rules:
            rule.add_target(cast(events.IRuleTarget, _DirectTarget(self.topic.topic_arn)))
            rule.add_target(cast(events.IRuleTarget, _DirectTarget(self.event_log_target_arn)))
        rule_arns = [rule.rule_arn for rule in rules]
        self.topic.add_to_resource_policy(
            iam.PolicyStatement(
                sid="EventBridgePublishesFailures",
                principals=[iam.ServicePrincipal("events.amazonaws.com")],
                actions=["sns:Publish"],
                resources=[self.topic.topic_arn],
                conditions={"ArnEquals": {"aws:SourceArn": rule_arns}},
            )
        )
        # EventBridge creates the log stream without a source-rule context, so aws:SourceArn can
        # only guard PutLogEvents (a condition on CreateLogStream makes every delivery fail).
        event_writers = [
            iam.ServicePrincipal("events.amazonaws.com"),
            iam.ServicePrincipal("delivery.logs.amazonaws.com"),
        ]
        logs.ResourcePolicy(
            self,
            "EventLogPolicy",
            resource_policy_name=f"{environment_prefix(env.name)}training-events",
            policy_statements=[
                iam.PolicyStatement(
                    sid="EventBridgeCreatesStreams",
                    principals=event_writers,
                    actions=["logs:CreateLogStream"],
                    resources=[self.event_log_group.log_group_arn],
                ),
                iam.PolicyStatement(
                    sid="EventBridgeWritesFailures",
                    principals=event_writers,
                    actions=["logs:PutLogEvents"],
                    resources=[self.event_log_group.log_group_arn],
                    conditions={"ArnEquals": {"aws:SourceArn": rule_arns}},
                ),
            ],
        )
        self.dashboard = self._dashboard(props)

    def _validate_props(self, props: TrainingObservabilityProps) -> None:
        """Fail synth with one line naming the prop: rules and dashboards need something to watch."""
        if not props.pipeline_names:
            raise ValueError(f"{self.node.path}: pipeline_names is empty: pass TrainingPipelines.pipeline_names")
        if not props.job_name_prefixes:
            raise ValueError(f"{self.node.path}: job_name_prefixes is empty: pass each pipeline's job_name_prefix")

    def _allow_services(self, key: kms.Key, stack: Stack) -> None:
        key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="EventBridgePublishesToEncryptedTopic",
                principals=[iam.ServicePrincipal("events.amazonaws.com")],
                actions=["kms:GenerateDataKey*", "kms:Decrypt"],
                resources=["*"],
                conditions={"StringEquals": {"aws:SourceAccount": stack.account}},
            )
        )
        key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="CloudWatchLogsEncryptsTrainingEventLogs",
                principals=[iam.ServicePrincipal(f"logs.{stack.region}.{stack.url_suffix}")],
                actions=["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"],
                resources=["*"],
                conditions=account_log_groups_condition(stack),
            )
        )

    # -- dashboard -------------------------------------------------------------------------

    def _dashboard(self, props: TrainingObservabilityProps) -> cloudwatch.Dashboard:
        env = props.environment
        dashboard = cloudwatch.Dashboard(
            self,
            "Dashboard",
            dashboard_name=f"{environment_prefix(env.name)}training",
            default_interval=Duration.days(7),
        )
        dashboard.add_widgets(
            cloudwatch.TextWidget(
                markdown=(
                    f"# btk {env.name}: training\n"
                    f"{env.instance_count} x {env.instance_type} per job. Metrics come from the trainer's "
                    "`btk_metric` lines (SageMaker MetricDefinitions); failures go to the SNS topic."
                ),
                width=24,
                height=2,
            )
        )
        dashboard.add_widgets(*self._pipeline_widgets(props))
        for profile, prefix in props.job_name_prefixes.items():
            dashboard.add_widgets(
                cloudwatch.TextWidget(markdown=f"## {profile}  (jobs `{prefix}-*`)", width=24, height=1)
            )
            dashboard.add_widgets(
                *[self._metric_graph(key, prefix, props.metric_period) for key in DASHBOARD_METRICS]
            )
        dashboard.add_widgets(
            cloudwatch.LogQueryWidget(
                title="Latest metric lines",
                log_group_names=[TRAINING_JOB_LOG_GROUP],
                query_lines=[
                    "fields @timestamp, @logStream, @message",
                    f"filter @logStream like /^{environment_prefix(env.name)}/ and @message like /btk_metric/",
                    "sort @timestamp desc",
                    "limit 50",
                ],
                width=24,
                height=6,
            )
        )
        return dashboard

    def _metric_graph(self, key: str, prefix: str, period: Duration) -> cloudwatch.GraphWidget:
        metric = METRICS_BY_KEY[key]
        expression = search_expression(metric.sagemaker_name, prefix, int(period.to_seconds()))
        return cloudwatch.GraphWidget(
            title=f"{metric.key} ({metric.unit})",
            left=[cloudwatch.MathExpression(expression=expression, label="", period=period, using_metrics={})],
            width=8,
            height=6,
        )

    def _pipeline_widgets(self, props: TrainingObservabilityProps) -> list[cloudwatch.IWidget]:
        def outcome(name: str) -> list[cloudwatch.IMetric]:
            return [
                cloudwatch.Metric(
                    namespace=PIPELINE_METRIC_NAMESPACE,
                    metric_name=name,
                    dimensions_map={"PipelineName": pipeline},
                    statistic="Sum",
                    period=Duration.days(1),
                    label=pipeline,
                )
                for pipeline in props.pipeline_names
            ]

        return [
            cloudwatch.GraphWidget(title="Pipeline executions succeeded", left=outcome("ExecutionSucceeded"),
                                   width=12, height=6),
            cloudwatch.GraphWidget(title="Pipeline executions failed", left=outcome("ExecutionFailed"),
                                   width=12, height=6),
        ]


def search_expression(metric_name: str, job_name_prefix: str, period_seconds: int) -> str:
    """CloudWatch SEARCH over the training jobs whose names contain ``job_name_prefix``."""
    return (
        f"SEARCH('{{{TRAINING_METRIC_NAMESPACE},{TRAINING_METRIC_DIMENSION}}} "
        f"MetricName=\"{metric_name}\" {TRAINING_METRIC_DIMENSION}={job_name_prefix}', "
        f"'Average', {period_seconds})"
    )


def _set_retention(group: logs.LogGroup, days: int) -> None:
    """Retention from the environment (already validated to a CloudWatch Logs value)."""
    cfn = group.node.default_child
    assert isinstance(cfn, logs.CfnLogGroup)
    cfn.retention_in_days = days
