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

import time
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from btk.pagination import paginate
from btk.report.aws import ACCESS_DENIED_CODES as _REPORT_DENIED
from btk.report.aws import BOTOCORE_MAX_ATTEMPTS
from btk.report.aws import THROTTLING_CODES as _REPORT_THROTTLING

#: Amazon SNS answers ``Throttled`` and ``AuthorizationError`` (its ThrottledException and
#: AuthorizationErrorException shapes in botocore's SNS model) where other services say
#: ``ThrottlingException`` and ``AccessDenied(Exception)``.
THROTTLING_CODES = _REPORT_THROTTLING | {"Throttled"}
ACCESS_DENIED_CODES = _REPORT_DENIED | {"AuthorizationError"}
#: Where the IAM actions ``btk doctor`` needs are listed.
IAM_DOC = "docs/deploy.md"

T = TypeVar("T")
#: What reading an answer outside AWS's documented shape raises (a stand-in's, a proxy's).
SHAPE_ERRORS = (KeyError, TypeError, ValueError, AttributeError)
ClientFactory = Callable[[str], Any]
"""Returns the client of a boto3 service name (``"sagemaker"``, ``"service-quotas"``, ...)."""


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
    """Clients of one boto3 session in ``region``, with botocore's standard retry mode, made once each.

    ``credentials``: an STS ``Credentials`` answer to use instead of boto3's usual chain.
    """
    import boto3
    from botocore.config import Config

    keys = {}
    if credentials is not None:
        keys = {
            "aws_access_key_id": credentials["AccessKeyId"],
            "aws_secret_access_key": credentials["SecretAccessKey"],
            "aws_session_token": credentials["SessionToken"],
        }
    session = boto3.session.Session(region_name=region, **keys)
    config = Config(retries={"mode": "standard", "max_attempts": BOTOCORE_MAX_ATTEMPTS}, user_agent_extra="btk-doctor")
    made: dict[str, Any] = {}

    def client(service: str) -> Any:
        if service not in made:
            made[service] = session.client(service, config=config)
        return made[service]

    return client


def iam_action(client: Any, operation: str) -> str:
    """The IAM action of a boto3 call, e.g. ``servicequotas:ListAWSDefaultServiceQuotas``."""
    meta = client.meta
    return f"{meta.service_model.signing_name}:{meta.method_to_api_mapping[operation]}"


def _error_details(error: Exception) -> tuple[str, str]:
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
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        action = self.action(service, operation)
        self.actions.append(action)
        for attempt in range(1, self._max_attempts + 1):
            try:
                response: dict[str, Any] = getattr(self._clients(service), operation)(**params)
                return response
            except ClientError as error:
                code, message = _error_details(error)
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
            except NoCredentialsError:
                raise UnansweredError(
                    "no AWS credentials found", "configure them (AWS_PROFILE, aws configure or SSO) and retry"
                ) from None
            except BotoCoreError as error:
                raise UnansweredError(
                    f"{action} failed: {str(error).splitlines()[0]}", "run btk doctor again when AWS answers"
                ) from None
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
