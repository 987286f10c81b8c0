"""Calling SageMaker for the report: pagination, retries on throttling, one-line errors.

boto3 is never imported here at module level; the caller passes a ready client (a real
one from :func:`make_client`, or one wrapped in ``botocore.stub.Stubber`` in tests).

Retries happen in two layers: botocore's own ``standard`` retry mode (which already backs
off on throttling), and :meth:`SageMakerReader.call`, which retries a throttled call again
with exponential backoff once botocore has given up. The sleep function is injectable so
that tests run instantly and can assert the delays.

Listings follow ``NextToken`` through :func:`btk.pagination.paginate`: an answer that repeats a
token or never runs out of pages stops the report with one line instead of looping. Every answer
is held to its operation's documented shape (:func:`btk.pagination.check_answer`): one outside it
stops the report with one line naming the call and the member, so the report's code reads required
members directly and optional ones with a default.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from btk.aws_clients import call_failure_line, call_failures
from btk.aws_clients import make_client as _make_client
from btk.errors import BtkError
from btk.pagination import check_answer, output_shape, paginate

THROTTLING_CODES = frozenset(
    {"ThrottlingException", "Throttling", "TooManyRequestsException", "RequestLimitExceeded", "SlowDown"}
)
ACCESS_DENIED_CODES = frozenset({"AccessDeniedException", "AccessDenied", "UnauthorizedOperation"})
NOT_FOUND_CODES = frozenset({"ResourceNotFound", "ResourceNotFoundException"})


class PermissionDeniedError(BtkError):
    """The caller lacks an IAM permission the report needs."""


class ResourceMissingError(BtkError):
    """The named SageMaker resource does not exist (e.g. a deleted pipeline)."""


def make_client(region: str) -> Any:
    """The report's SageMaker client for ``region`` (:mod:`btk.aws_clients`: set-up checked, waits bounded)."""
    return _make_client("sagemaker", region, purpose="btk-report")


def _action(operation: str) -> str:
    """The IAM action of a boto3 method name: ``list_pipeline_executions`` → ``sagemaker:ListPipelineExecutions``."""
    return "sagemaker:" + "".join(part.capitalize() for part in operation.split("_"))


def _error_code(error: Exception) -> str:
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def _error_message(error: Exception) -> str:
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Message", "")).splitlines()[0] if response.get("Error") else ""
    return ""


class SageMakerReader:
    """Read-only SageMaker calls with pagination and throttling retries.

    Args:
        client: a botocore SageMaker client.
        sleep: called with the delay in seconds between attempts (default ``time.sleep``).
        max_attempts: attempts per call, the first included, before a throttling error is
            reported to the user.
        base_delay: delay before the second attempt; it doubles each attempt up to
            ``max_delay``.
    """

    def __init__(
        self,
        client: Any,
        *,
        sleep: Callable[[float], None] = time.sleep,
        max_attempts: int = 6,
        base_delay: float = 1.0,
        max_delay: float = 30.0,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self._client = client
        self._sleep = sleep
        self._max_attempts = max_attempts
        self._base_delay = base_delay
        self._max_delay = max_delay
        self.calls = 0
        self.throttled = 0

    def call(self, operation: str, **params: Any) -> dict[str, Any]:
        """Call ``operation`` (the boto3 method name, e.g. ``describe_training_job``); its answer has the
        operation's documented shape (else one line)."""
        action = _action(operation)
        response = self._answer(operation, action, params)
        shape = output_shape(self._client, "sagemaker", action.removeprefix("sagemaker:"))
        checked: dict[str, Any] = check_answer(response, shape, operation=action, error=BtkError)
        return checked

    def _answer(self, operation: str, action: str, params: dict[str, Any]) -> Any:
        """What ``operation`` answers, retried while throttled; every AWS failure is one line."""
        from botocore.exceptions import ClientError

        for attempt in range(1, self._max_attempts + 1):
            self.calls += 1
            try:
                return getattr(self._client, operation)(**params)
            except ClientError as error:
                code = _error_code(error)
                if code in THROTTLING_CODES and attempt < self._max_attempts:
                    self.throttled += 1
                    self._sleep(min(self._max_delay, self._base_delay * 2 ** (attempt - 1)))
                    continue
                if code in THROTTLING_CODES:
                    raise BtkError(
                        f"{action} is still throttled after {self._max_attempts} attempts: "
                        "retry later or narrow the window with --since/--profile"
                    ) from None
                if code in ACCESS_DENIED_CODES:
                    raise PermissionDeniedError(
                        f"AWS denied {action} ({code}): grant the caller {action} "
                        "(docs/report.md lists the read-only policy btk report needs)"
                    ) from None
                if code in NOT_FOUND_CODES or (
                    code == "ValidationException" and "does not exist" in _error_message(error)
                ):
                    raise ResourceMissingError(f"{action}: {_error_message(error) or code}") from None
                raise BtkError(f"{action} failed ({code}): {_error_message(error)}") from None
            except call_failures() as error:
                raise BtkError(f"{action} failed: {call_failure_line(error)}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def pages(self, operation: str, result_key: str, **params: Any) -> Iterator[dict[str, Any]]:
        """Every item under ``result_key`` across all pages (``NextToken`` pagination, bounded:
        a repeated token or more than :data:`~btk.pagination.MAX_PAGES` pages is one line)."""
        return paginate(
            lambda token: self.call(operation, **params, **({"NextToken": token} if token else {})),
            operation=_action(operation),
            result_key=result_key,
            error=BtkError,
        )
