#!/usr/bin/env python3
"""The yardstick of ``synth_time.py``: a bare CDK app with a VPC, a KMS key and a bucket.

No cdk-nag, no SageMaker SDK: what any CDK Python app of this shape costs to synthesize on
the same machine, so that the training stack's synth time can be read as a ratio.

    cdk synth --app ".venv/bin/python benchmarks/bare_app.py"
"""

from __future__ import annotations

from aws_cdk import App, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3


def main() -> None:
    app = App(analytics_reporting=False)
    stack = Stack(app, "BareStack")
    ec2.Vpc(stack, "Vpc", max_azs=1)
    key = kms.Key(stack, "Key", enable_key_rotation=True)
    s3.Bucket(stack, "Bucket", encryption=s3.BucketEncryption.KMS, encryption_key=key)
    app.synth()


if __name__ == "__main__":
    main()
