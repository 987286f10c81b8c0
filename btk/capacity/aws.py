"""SageMaker calls: their failures as one line each, their answers held to their documented shape.

The client is the caller's: ``btk capacity`` makes it with :mod:`btk.aws_clients`, the training-plan
custom resource with boto3 in Lambda (this package is bundled with it: the standard library, boto3 and
:mod:`btk.pagination` only). boto3/botocore are imported inside functions only.
"""

from __future__ import annotations

import re
from typing import Any

from btk.capacity.model import CapacityError
from btk.pagination import check_answer, output_shape


def _call(client: Any, operation: str, **parameters: Any) -> dict[str, Any]:
    """Call ``operation``: an AWS/botocore failure, or an answer outside its documented shape, is one CapacityError."""
    from botocore.exceptions import BotoCoreError, ClientError
    from botocore.parsers import ResponseParserError  # not a BotoCoreError

    try:
        response = getattr(client, operation)(**parameters)
    except (ClientError, BotoCoreError, ResponseParserError) as error:
        raise _one_line(error, operation) from None
    return _answer(client, operation, response)


def _answer(client: Any, operation: str, response: Any) -> dict[str, Any]:
    """``response`` of ``operation`` once it has the operation's documented shape (else one CapacityError line)."""
    api = _api_name(operation)
    checked: dict[str, Any] = check_answer(
        response, output_shape(client, "sagemaker", api), operation=f"sagemaker:{api}", error=CapacityError
    )
    return checked


def _api_name(operation: str) -> str:
    """The API's name of a boto3 method: ``list_training_plans`` → ``ListTrainingPlans``."""
    return "".join(part.capitalize() for part in operation.split("_"))


NOT_AWS = "check AWS_ENDPOINT_URL and any HTTPS_PROXY"
_PAGE_TITLE = re.compile(r".*?<title>(.*?)</title>", re.IGNORECASE | re.DOTALL)


def _html_page(message: str) -> str | None:
    """The title of an error "message" that is an HTML page (a proxy's or an emulator's error page: no AWS
    service answers with one), ``"no title"`` when it has none; None for any other message."""
    if not message.lstrip().startswith("<"):
        return None
    # match, not search: tests/permission_reference.py reads a call of a method named like a SageMaker API
    # (``search``) in this package as that API's call.
    title = _PAGE_TITLE.match(message)
    return " ".join(title.group(1).split()) if title else "no title"


def _one_line(error: Exception, operation: str) -> CapacityError:
    from botocore.exceptions import ClientError

    api = _api_name(operation)
    if isinstance(error, ClientError):
        details = error.response.get("Error", {})
        code = details.get("Code", "Error")
        message = " ".join(str(details.get("Message", "")).split())
        api = error.operation_name or api
        page = _html_page(message)
        if page is not None:
            return CapacityError(f"{api} failed: {code}: an HTML page ({page}), not an AWS answer ({NOT_AWS})")
        return CapacityError(f"{api} failed: {code}: {message}".rstrip(": "))
    from botocore.parsers import ResponseParserError

    if isinstance(error, ResponseParserError):
        return CapacityError(f"{api} failed: the answer is not in the service's format ({NOT_AWS})")
    text = " ".join(str(error).split())
    return CapacityError(f"{api} failed: {text} (configure AWS credentials and region)")


def _error_code(error: Exception) -> str:
    from botocore.exceptions import ClientError

    return str(error.response.get("Error", {}).get("Code", "")) if isinstance(error, ClientError) else ""


def _is_not_found(error: Exception) -> bool:
    return _error_code(error) in ("ResourceNotFound", "ResourceNotFoundException")
