"""The read-only AWS calls of ``btk doctor``: retries on throttling, every failure one line.

boto3 is imported only in :func:`client_factory`; a caller gets clients by service name from a
factory, so tests pass real botocore clients wrapped in ``botocore.stub.Stubber``.

Retries happen in two layers, as in ``btk report`` (:mod:`btk.report.aws`): botocore's
``standard`` retry mode, then :meth:`Caller.call`, which retries a call still throttled with
exponential backoff (the sleep is injectable). What AWS answers instead of a result becomes:

- :class:`UnansweredError`: the call was denied, stayed throttled, found no credentials or no
  endpoint. The check that made it cannot say anything and reports so (a warning); the other
  checks still run.
- :class:`ServiceError`: any other error answer, with its code; the check decides what it
  means (``ParameterNotFound`` is a missing bootstrap, not an outage).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from btk import aws_clients
from btk.aws_clients import NOT_AWS_REMEDY, ClientFactory, call_failures, describe_call_failure
from btk.pagination import check_answer, method_output_shape, paginate
from btk.report.aws import ACCESS_DENIED_CODES as _REPORT_DENIED
from btk.report.aws import THROTTLING_CODES as _REPORT_THROTTLING

#: Amazon SNS answers ``Throttled`` and ``AuthorizationError`` (its ThrottledException and
#: AuthorizationErrorException shapes in botocore's SNS model) where other services say
#: ``ThrottlingException`` and ``AccessDenied(Exception)``.
THROTTLING_CODES = _REPORT_THROTTLING | {"Throttled"}
ACCESS_DENIED_CODES = _REPORT_DENIED | {"AuthorizationError"}
#: Where the IAM actions ``btk doctor`` needs are listed.
IAM_DOC = "docs/deploy.md"

#: Members botocore's own handlers turn into something other than the model's type before a caller sees
#: them: ``botocore.handlers.json_decode_template_body`` parses CloudFormation's template body (a string
#: in the model) when it is JSON. They are checked as the service sent them.
DECODED_BY_BOTOCORE = {("cloudformation", "get_template"): "TemplateBody"}

T = TypeVar("T")
#: What reading an answer outside AWS's documented shape raises (a stand-in's, a proxy's).
SHAPE_ERRORS = (KeyError, TypeError, ValueError, AttributeError)


class UnansweredError(Exception):
    """AWS gave no usable answer (denied, throttled, no credentials, no endpoint): one line, and what to do."""

    def __init__(self, message: str, remedy: str) -> None:
        super().__init__(message)
        self.remedy = remedy


class ServiceError(Exception):
    """An error answer of an AWS service that a check may interpret by its code."""

    def __init__(self, action: str, code: str, message: str) -> None:
        super().__init__(f"{action} failed ({code}): {message}".rstrip(": "))
        self.action = action
        self.code = code
        self.message = message


def client_factory(region: str, credentials: dict[str, Any] | None = None) -> ClientFactory:
    """The doctor's clients in ``region`` (:func:`btk.aws_clients.client_factory`: the set-up checked before
    the first call, every wait bounded).

    ``credentials``: an STS ``Credentials`` answer to use instead of boto3's usual chain.
    """
    return aws_clients.client_factory(region, purpose="btk-doctor", credentials=credentials)


def iam_action(client: Any, operation: str) -> str:
    """The IAM action of a boto3 call, e.g. ``servicequotas:ListAWSDefaultServiceQuotas``."""
    meta = client.meta
    return f"{meta.service_model.signing_name}:{meta.method_to_api_mapping[operation]}"


def error_details(error: Exception) -> tuple[str, str]:
    """The code and the first line of the message of an AWS error answer (botocore's ``ClientError``)."""
    details = getattr(error, "response", {}).get("Error", {})
    message = " ".join(str(details.get("Message", "")).split("\n")[0].split())
    return str(details.get("Code", "")), message


class Caller:
    """Read-only AWS calls with throttling retries; records the IAM actions it used.

    Args:
        clients: the client of each service (:func:`client_factory`, or Stubber-wrapped clients).
        sleep: called with the delay in seconds between attempts (default ``time.sleep``).
        max_attempts: attempts per call, the first included, before a throttled call is
            :class:`UnansweredError`.
        base_delay: delay before the second attempt; it doubles each attempt up to ``max_delay``.
    """

    def __init__(
        self,
        clients: ClientFactory,
        *,
        sleep: Callable[[float], None] = time.sleep,
        max_attempts: int = 4,
        base_delay: float = 1.0,
        max_delay: float = 8.0,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self._clients = clients
        self._sleep = sleep
        self._max_attempts = max_attempts
        self._base_delay = base_delay
        self._max_delay = max_delay
        self.actions: list[str] = []

    def call(self, service: str, operation: str, **params: Any) -> dict[str, Any]:
        """The response of ``operation`` (the boto3 method name) of ``service``."""
        action = self.action(service, operation)
        self.actions.append(action)
        response = self._answer(service, operation, action, params)
        shape = method_output_shape(self._clients(service), service, operation)
        check_answer(
            _as_sent(service, operation, response), shape, operation=action,
            error=lambda problem: UnansweredError(problem, NOT_AWS_REMEDY),
        )  # fmt: skip
        checked: dict[str, Any] = response
        return checked

    def _answer(self, service: str, operation: str, action: str, params: dict[str, Any]) -> Any:
        """What ``operation`` answers, retried while throttled; a failure is one of this module's errors."""
        from botocore.exceptions import ClientError

        for attempt in range(1, self._max_attempts + 1):
            try:
                return getattr(self._clients(service), operation)(**params)
            except ClientError as error:
                code, message = error_details(error)
                if code in THROTTLING_CODES and attempt < self._max_attempts:
                    self._sleep(min(self._max_delay, self._base_delay * 2 ** (attempt - 1)))
                    continue
                if code in THROTTLING_CODES:
                    raise UnansweredError(
                        f"{action} still throttled ({code}) after {self._max_attempts} attempts",
                        "run btk doctor again later",
                    ) from None
                if code in ACCESS_DENIED_CODES:
                    raise UnansweredError(
                        f"AWS denied {action} ({code})",
                        f"grant it to the caller ({IAM_DOC} lists what btk doctor needs)",
                    ) from None
                raise ServiceError(action, code or "Error", message) from None
            except call_failures() as error:
                what, remedy = describe_call_failure(error)
                raise UnansweredError(f"{action} failed: {what}", remedy) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def items(
        self, service: str, operation: str, key: str, *, token: str = "NextToken", **params: Any
    ) -> Iterator[Any]:
        """Every item under ``key`` across all pages (``token`` names the page token: ``nextToken`` for ECR).

        Bounded by :func:`btk.pagination.paginate`: a listing that repeats a token or never ends
        is :class:`UnansweredError`.
        """

        def fetch(next_token: str | None) -> dict[str, Any]:
            return self.call(service, operation, **params, **({token: next_token} if next_token else {}))

        def unanswered(message: str) -> UnansweredError:
            return UnansweredError(message, "run btk doctor again later")

        action = self.action(service, operation)
        yield from paginate(fetch, operation=action, result_key=key, token_key=token, error=unanswered)

    def action(self, service: str, operation: str) -> str:
        """The IAM action of ``operation``; ``service:operation`` when no client can be made to ask."""
        from botocore.exceptions import BotoCoreError

        try:
            return iam_action(self._clients(service), operation)
        except (BotoCoreError, KeyError, AttributeError):
            return f"{service}:{operation}"


def _as_sent(service: str, operation: str, response: Any) -> Any:
    """``response`` with a member :data:`DECODED_BY_BOTOCORE` decoded put back as the text it was sent as."""
    member = DECODED_BY_BOTOCORE.get((service, operation))
    if member is None or not isinstance(response, dict) or not isinstance(response.get(member), dict):
        return response
    return {**response, member: json.dumps(response[member])}


class Answer(Generic[T]):
    """One AWS read shared by several checks: made on first use, its result or its failure kept.

    Several quota checks read one Service Quotas listing; when that listing is denied, each of
    them reports the denial instead of asking again.
    """

    def __init__(self, fetch: Callable[[], T]) -> None:
        self._fetch = fetch
        self._value: tuple[T] | None = None
        self._failure: Exception | None = None

    def get(self) -> T:
        if self._value is None and self._failure is None:
            try:
                self._value = (self._fetch(),)
            except (UnansweredError, ServiceError, *SHAPE_ERRORS) as failure:
                self._failure = failure
        if self._failure is not None:
            raise self._failure
        assert self._value is not None
        return self._value[0]
