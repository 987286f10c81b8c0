"""What happens to the environment's data when its stack is deleted."""

from __future__ import annotations

from aws_cdk import RemovalPolicy


def data_removal_policy(retain_data: bool) -> RemovalPolicy:
    """RETAIN (keep the key, buckets, file system and logs) or DESTROY, per ``retain_data``.

    Every construct that holds the environment's data asks here, so a stack never keeps its
    buckets but deletes the key that encrypts them.
    """
    return RemovalPolicy.RETAIN if retain_data else RemovalPolicy.DESTROY
