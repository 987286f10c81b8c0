"""What happens to the environment's data when its stack is deleted, and how what is kept never blocks a redeploy."""

from __future__ import annotations

from aws_cdk import Fn, RemovalPolicy, Stack

#: Characters of :func:`stack_generation` (the first group of the stack id's UUID).
GENERATION_CHARS = 8


def data_removal_policy(retain_data: bool) -> RemovalPolicy:
    """RETAIN (keep the key, buckets and log groups) or DESTROY, per ``retain_data``.

    Every construct that holds the environment's data asks here, so a stack never keeps its
    buckets but deletes the key that encrypts them. The FSx file system is not data: it is a
    cache of the datasets prefix (the data repository association exports what jobs write), so
    it always goes with the stack, and with it the need to keep the VPC, subnet and security
    group it sits in.
    """
    return RemovalPolicy.RETAIN if retain_data else RemovalPolicy.DESTROY


def stack_generation(stack: Stack) -> str:
    """A token: the first 8 hex digits of the stack's id, new each time the stack is created.

    A resource that is kept when the stack is deleted and has a fixed physical name carries it
    in its name, so the next ``cdk deploy`` of the environment creates a new one beside what was
    kept instead of failing with "already exists". The stack id is a pseudo parameter, so a
    name built from it is known before any resource exists (the data key's policy can name it).
    """
    uuid = Fn.select(2, Fn.split("/", stack.stack_id))
    return Fn.select(0, Fn.split("-", uuid))
