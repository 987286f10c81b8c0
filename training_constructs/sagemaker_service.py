"""What SageMaker itself fixes: its principal, its jobs' log groups and metric namespaces.

The execution role may write exactly these log groups, and the dashboard reads them: one
definition, so the role and the dashboard cannot name different groups.
"""

from __future__ import annotations

from aws_cdk import Stack
from aws_cdk import aws_iam as iam

#: Log group of training-job logs (created by SageMaker on first use).
TRAINING_JOB_LOG_GROUP = "/aws/sagemaker/TrainingJobs"
#: Log group of processing-job logs (created by SageMaker on first use).
PROCESSING_JOB_LOG_GROUP = "/aws/sagemaker/ProcessingJobs"
#: Every log group SageMaker writes job logs to.
SAGEMAKER_LOG_GROUPS = (TRAINING_JOB_LOG_GROUP, PROCESSING_JOB_LOG_GROUP)
#: The CloudWatch namespace SageMaker publishes training jobs' metric-definition values to.
TRAINING_METRIC_NAMESPACE = "/aws/sagemaker/TrainingJobs"
#: The dimension of those metrics: the job's name.
TRAINING_METRIC_DIMENSION = "TrainingJobName"
#: The namespace of SageMaker Pipelines' execution metrics.
PIPELINE_METRIC_NAMESPACE = "AWS/Sagemaker/ModelBuildingPipeline"


def sagemaker_principal(stack: Stack) -> iam.ServicePrincipal:
    """SageMaker as a principal, only on behalf of this stack's account (confused-deputy guard)."""
    return iam.ServicePrincipal(
        "sagemaker.amazonaws.com",
        conditions={"StringEquals": {"aws:SourceAccount": stack.account}},
    )
