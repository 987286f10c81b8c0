"""The SageMaker client and its failures as one line each (boto3/botocore imported inside functions only)."""

from __future__ import annotations

from typing import Any

from btk.capacity.model import CapacityError


def sagemaker_client(region: str) -> Any:
    """The boto3 SageMaker client every call here uses (tests replace this function)."""
    import boto3

    return boto3.client("sagemaker", region_name=region)


def _call(client: Any, operation: str, **parameters: Any) -> dict[str, Any]:
    """Call ``operation`` and turn any AWS/botocore failure into one CapacityError line."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        response: dict[str, Any] = getattr(client, operation)(**parameters)
    except (ClientError, BotoCoreError) as error:
        raise _one_line(error, operation) from None
    return response


def _one_line(error: Exception, operation: str) -> CapacityError:
    from botocore.exceptions import ClientError

    if isinstance(error, ClientError):
        details = error.response.get("Error", {})
        code = details.get("Code", "Error")
        message = " ".join(str(details.get("Message", "")).split())
        api = error.operation_name or operation
        return CapacityError(f"{api} failed: {code}: {message}".rstrip(": "))
    text = " ".join(str(error).split())
    return CapacityError(f"{operation} failed: {text} (configure AWS credentials and region)")


def _error_code(error: Exception) -> str:
    from botocore.exceptions import ClientError

    return str(error.response.get("Error", {}).get("Code", "")) if isinstance(error, ClientError) else ""


def _is_not_found(error: Exception) -> bool:
    return _error_code(error) in ("ResourceNotFound", "ResourceNotFoundException")
