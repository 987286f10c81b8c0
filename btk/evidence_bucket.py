"""The team's evidence in the environment's artifacts bucket: ``btk evidence push|pull --env ENV``.

The local store (:mod:`btk.evidence`) is one person's; the environment's copy is the team's. It is
one object, ``s3://<ArtifactsBucketName>/btk/evidence.json`` (the stack's output; the bucket is
versioned and encrypted with the environment's data key, so every push keeps the one before it),
in the same format as the local file. Both directions merge by run id, never overwrite: ``push``
writes the bucket's runs plus the local ones (a local run replaces the bucket's of the same id),
``pull`` adds the bucket's runs to the local store (the bucket's replaces the local one).

A push writes only if the object is still the one it read (S3's conditional write: ``If-Match``
the ETag it read, ``If-None-Match: *`` where there was none): two people pushing at once cannot
drop each other's runs; the later one is told to push again. Every failure is one line: no
stack, no such output, an object that is not evidence, a denied or failed call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from btk.aws_clients import ClientFactory
from btk.doctor.aws import error_details
from btk.environment import EnvironmentConfig
from btk.errors import BtkError
from btk.evidence import Evidence, parse_evidence

EVIDENCE_KEY = "btk/evidence.json"
ARTIFACTS_OUTPUT = "ArtifactsBucketName"
MAX_EVIDENCE_BYTES = 64 * 1024 * 1024
"""Larger than any evidence file a team writes (a run is under 2 KB); a bigger object is not one."""


@dataclass(frozen=True)
class BucketEvidence:
    """The environment's evidence object as read: where it is, its runs, and the ETag a push must still find."""

    uri: str
    evidence: Evidence
    etag: str | None
    """None: there was no object."""


def _failure(error: Exception) -> BtkError:
    from btk.doctor.aws import UnansweredError

    return BtkError(f"{error}: {error.remedy}" if isinstance(error, UnansweredError) else str(error))


def artifacts_bucket(clients: ClientFactory, env: EnvironmentConfig) -> str:
    """The environment's artifacts bucket, from its stack's ``ArtifactsBucketName`` output."""
    from btk.doctor.aws import Caller, ServiceError, UnansweredError
    from btk.doctor.deployed import describe_stack

    try:
        stack = describe_stack(Caller(clients), env.stack_name)
    except (ServiceError, UnansweredError) as error:
        raise _failure(error) from None
    if stack is None:
        raise BtkError(f"stack {env.stack_name} does not exist in {env.region}: the team's evidence lives in its "
                       f"artifacts bucket; deploy it first (npx cdk deploy TrainingStack -c env={env.name})")
    bucket = stack.outputs.get(ARTIFACTS_OUTPUT, "")
    if not bucket:
        raise BtkError(f"stack {env.stack_name} ({stack.status}) has no {ARTIFACTS_OUTPUT} output: deploy the "
                       "current TrainingStack")
    return bucket


def read_bucket_evidence(clients: ClientFactory, bucket: str) -> BucketEvidence:
    """The evidence object in ``bucket`` (no object: no runs)."""
    from botocore.exceptions import ClientError

    from btk.aws_clients import call_failure_line, call_failures

    uri = f"s3://{bucket}/{EVIDENCE_KEY}"
    try:
        answer = clients("s3").get_object(Bucket=bucket, Key=EVIDENCE_KEY)
        length = answer.get("ContentLength")
        if isinstance(length, int) and length > MAX_EVIDENCE_BYTES:
            raise BtkError(f"{uri}: {length:,} bytes is not an evidence file (at most {MAX_EVIDENCE_BYTES:,})")
        body = answer["Body"].read(MAX_EVIDENCE_BYTES + 1)
    except ClientError as error:
        code, message = error_details(error)
        if code in ("NoSuchKey", "404"):
            return BucketEvidence(uri, Evidence(), None)
        raise _s3_failure("s3:GetObject", uri, code, message) from None
    except call_failures() as error:
        raise BtkError(f"s3:GetObject {uri} failed: {call_failure_line(error)}") from None
    if len(body) > MAX_EVIDENCE_BYTES:
        raise BtkError(f"{uri}: more than {MAX_EVIDENCE_BYTES:,} bytes is not an evidence file")
    etag = answer.get("ETag")
    return BucketEvidence(uri, parse_evidence(body, uri), etag if isinstance(etag, str) and etag else None)


def write_bucket_evidence(clients: ClientFactory, bucket: str, evidence: Evidence, read: BucketEvidence) -> None:
    """Write ``evidence`` to ``bucket`` if the object is still the one ``read`` found."""
    from botocore.exceptions import ClientError

    from btk.aws_clients import call_failure_line, call_failures

    condition: dict[str, Any] = {"IfMatch": read.etag} if read.etag is not None else {"IfNoneMatch": "*"}
    body = (evidence.model_dump_json(indent=1) + "\n").encode()
    try:
        clients("s3").put_object(Bucket=bucket, Key=EVIDENCE_KEY, Body=body, ContentType="application/json",
                                 **condition)
    except ClientError as error:
        code, message = error_details(error)
        if code in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
            raise BtkError(f"{read.uri} changed while this push merged it (someone else pushed): push again") from None
        raise _s3_failure("s3:PutObject", read.uri, code, message) from None
    except call_failures() as error:
        raise BtkError(f"s3:PutObject {read.uri} failed: {call_failure_line(error)}") from None


def _s3_failure(action: str, uri: str, code: str, message: str) -> BtkError:
    from btk.report.aws import ACCESS_DENIED_CODES

    if code in ACCESS_DENIED_CODES:
        return BtkError(f"AWS denied {action} on {uri} ({code}): the caller needs {action} on the artifacts bucket "
                        "and kms:Decrypt/kms:GenerateDataKey on the environment's data key")
    if code == "NoSuchBucket":
        return BtkError(f"{uri}: the bucket does not exist (the stack's {ARTIFACTS_OUTPUT} output names a bucket "
                        "that is gone): deploy the stack again")
    return BtkError(f"{action} {uri} failed ({code or 'error'}){': ' + message if message else ''}")
