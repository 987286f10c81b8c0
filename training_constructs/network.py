"""The private network a multi-node training job runs in.

One VPC with PRIVATE_ISOLATED subnets (no internet, no NAT), the VPC endpoints a
SageMaker training job needs to pull its image, write logs and metrics and read S3, flow
logs to an encrypted log group, and an EFA-ready security group shared by the training
instances and the FSx for Lustre file system.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct

from btk.environment import TRAINING_SUBNET_PREFIX
from training_constructs.nag import acknowledge

#: Interface endpoints a training job in an isolated subnet needs, by construct id. None for
#: the SageMaker API or STS: nothing inside the VPC calls them (SageMaker Pipelines and the
#: report tool call SageMaker from outside, and the trainer makes no AWS API call), and each
#: interface endpoint is billed by the hour.
INTERFACE_ENDPOINTS: dict[str, ec2.InterfaceVpcEndpointAwsService] = {
    "EcrApi": ec2.InterfaceVpcEndpointAwsService.ECR,
    "EcrDocker": ec2.InterfaceVpcEndpointAwsService.ECR_DOCKER,
    "Logs": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS,
    "Monitoring": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_MONITORING,
}

#: Lustre uses TCP 988 for LNet and 1018-1023 for the client's reserved ports.
LUSTRE_PORTS: tuple[ec2.Port, ...] = (ec2.Port.tcp(988), ec2.Port.tcp_range(1018, 1023))


@dataclass(frozen=True)
class TrainingNetworkProps:
    """Props of :class:`TrainingNetwork`.

    :param cidr: IPv4 CIDR of the VPC (e.g. ``10.80.0.0/16``).
    :param availability_zone: the AZ the GPUs and the file system live in; the VPC has one
        isolated subnet there (``/20``).
    :param flow_log_key: KMS key that encrypts the flow-log group.
    :param flow_log_retention: retention of the flow-log group. Default: one month.
    :param removal_policy: removal policy of the flow-log group. Default: DESTROY.
    """

    cidr: str
    availability_zone: str
    flow_log_key: kms.IKey
    flow_log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH
    removal_policy: RemovalPolicy = RemovalPolicy.DESTROY


class TrainingNetwork(Construct):
    """VPC, endpoints, flow logs and the EFA/Lustre security group of one environment.

    Attributes: ``vpc``, ``training_subnet`` (the isolated subnet in the configured AZ),
    ``security_group`` (EFA-ready: all traffic to and from itself, Lustre ports, HTTPS to
    the endpoints), ``endpoint_security_group`` and ``flow_log_group``.
    """

    def __init__(self, scope: Construct, construct_id: str, *, props: TrainingNetworkProps) -> None:
        super().__init__(scope, construct_id)
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(props.cidr),
            availability_zones=[props.availability_zone],
            nat_gateways=0,
            subnet_configuration=[
                ec2.SubnetConfiguration(
                    name="training", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED, cidr_mask=TRAINING_SUBNET_PREFIX
                )
            ],
            enable_dns_hostnames=True,
            enable_dns_support=True,
        )
        self.training_subnet: ec2.ISubnet = self.vpc.isolated_subnets[0]
        self._pin_availability_zone()

        self.flow_log_group = logs.LogGroup(
            self,
            "FlowLogs",
            encryption_key=props.flow_log_key,
            retention=props.flow_log_retention,
            removal_policy=props.removal_policy,
        )
        flow_log_role = iam.Role(
            self, "FlowLogRole", assumed_by=iam.ServicePrincipal("vpc-flow-logs.amazonaws.com")
        )
        self.vpc.add_flow_log(
            "FlowLog",
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(self.flow_log_group, flow_log_role),
            traffic_type=ec2.FlowLogTrafficType.ALL,
        )

        self.security_group = self._training_security_group()
        self.endpoint_security_group = ec2.SecurityGroup(
            self,
            "EndpointSecurityGroup",
            vpc=self.vpc,
            description="VPC interface endpoints: HTTPS from the training security group only",
            allow_all_outbound=False,
        )
        self.endpoint_security_group.add_ingress_rule(
            self.security_group, ec2.Port.tcp(443), "HTTPS from training instances"
        )
        subnets = ec2.SubnetSelection(subnets=[self.training_subnet])
        self.s3_endpoint = self.vpc.add_gateway_endpoint(
            "S3", service=ec2.GatewayVpcEndpointAwsService.S3, subnets=[subnets]
        )
        # Isolated subnets have no route to the internet: HTTPS egress reaches only the
        # interface endpoints and S3 through the gateway endpoint's route. The S3 prefix-list
        # id would need an AWS lookup at synth, so the rule names any IPv4 destination.
        self.security_group.add_egress_rule(
            ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "HTTPS to VPC endpoints and S3 (no internet route)"
        )
        self.interface_endpoints: dict[str, ec2.InterfaceVpcEndpoint] = {}
        for endpoint_id, service in INTERFACE_ENDPOINTS.items():
            self.interface_endpoints[endpoint_id] = self.vpc.add_interface_endpoint(
                endpoint_id,
                service=service,
                subnets=subnets,
                security_groups=[self.endpoint_security_group],
                private_dns_enabled=True,
                open=False,
            )

    def _pin_availability_zone(self) -> None:
        """The AZ name is configuration, not an accident: tell the linters so, with the reason."""
        reason = (
            "the subnet must sit in the configured AZ: GPU capacity (p6-b200, training plans) and the "
            "FSx file system are bound to one AZ, chosen per environment"
        )
        for subnet in self.vpc.isolated_subnets:
            cfn_subnet = subnet.node.default_child
            assert isinstance(cfn_subnet, ec2.CfnSubnet)
            acknowledge(cfn_subnet, "CloudFormation-Validate::W3010", reason)
            cfn_subnet.add_metadata("cfn-lint", {"config": {"ignore_checks": ["W3010"]}})

    def _training_security_group(self) -> ec2.SecurityGroup:
        group = ec2.SecurityGroup(
            self,
            "TrainingSecurityGroup",
            vpc=self.vpc,
            description="EFA-ready: all traffic to and from itself; Lustre; HTTPS to endpoints",
            allow_all_outbound=False,
        )
        # EFA requires an SG that allows all inbound and outbound traffic to and from itself.
        group.add_ingress_rule(group, ec2.Port.all_traffic(), "EFA and NCCL between training nodes")
        group.add_egress_rule(group, ec2.Port.all_traffic(), "EFA and NCCL between training nodes")
        for port in LUSTRE_PORTS:
            group.add_ingress_rule(group, port, "Lustre between clients and file servers")
            group.add_egress_rule(group, port, "Lustre between clients and file servers")
        return group

