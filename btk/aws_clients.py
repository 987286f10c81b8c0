"""Every AWS client ``btk`` makes, made here: one session, every wait bounded, the set-up's failures as one line.

``btk doctor``, ``btk capacity`` and ``btk report`` call AWS through clients from :func:`client_factory`.
What a user's AWS set-up can get wrong is found when the session is made, before the first call, and is
raised as :class:`AwsSetupError` (one line naming what to fix; the CLI exits 2):

- a named profile that is in neither AWS file (``AWS_PROFILE``), a config file that does not parse
  (``AWS_CONFIG_FILE``, ``~/.aws/config``);
- no credentials at all, half a key pair, an SSO session without a valid token (``aws sso login``);
- a ``credential_process`` that fails, prints something other than its JSON document, or does not answer
  within :data:`CREDENTIAL_PROCESS_TIMEOUT_S` (it is killed);
- an endpoint that is not a URL (``AWS_ENDPOINT_URL``, ``AWS_ENDPOINT_URL_<SERVICE>``, ``endpoint_url``).

The credentials are resolved eagerly for this: boto3 resolves SSO credentials only at the first call,
where a missing token would read as an outage. Every call is bounded by :data:`CONNECT_TIMEOUT_S`,
:data:`READ_TIMEOUT_S` and botocore's ``standard`` retry mode (:data:`BOTOCORE_MAX_ATTEMPTS` attempts).

A failure during a call that is not AWS's error answer (no connection, a timeout, an answer that is not
the service's format) is in :data:`CALL_FAILURES`; :func:`call_failure_line` says it in one line.
boto3 and botocore are imported inside functions only: ``btk plan`` never loads them.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from typing import Any

from btk.errors import BtkError

#: Attempts per call in botocore's ``standard`` retry mode, the first included.
BOTOCORE_MAX_ATTEMPTS = 5
#: Seconds to open a connection to an endpoint (botocore's default is 60).
CONNECT_TIMEOUT_S = 10
#: Seconds to wait for an answer once connected (botocore's default).
READ_TIMEOUT_S = 60
#: Seconds a profile's ``credential_process`` may take to print its credentials before it is killed.
CREDENTIAL_PROCESS_TIMEOUT_S = 60

ClientFactory = Callable[[str], Any]
"""Returns the client of a boto3 service name (``"sagemaker"``, ``"service-quotas"``, ...)."""


#: What to do without credentials: every command that calls AWS says the same.
NO_CREDENTIALS_REMEDY = "set AWS_PROFILE to a profile of ~/.aws/config, run aws configure, or aws sso login"
NO_CREDENTIALS = f"no AWS credentials found: {NO_CREDENTIALS_REMEDY}"
#: What to check when an answer is not the service's: something other than AWS answered.
NOT_AWS_REMEDY = "check AWS_ENDPOINT_URL and any HTTPS_PROXY"


class AwsSetupError(BtkError):
    """The AWS session cannot be made as configured: a profile, a file, a variable or the credentials."""


def call_failures() -> tuple[type[Exception], ...]:
    """What a call raises besides AWS's error answer (``ClientError``): botocore's own errors (no connection,
    a timeout) and an answer botocore cannot parse (``ResponseParserError`` is not a ``BotoCoreError``)."""
    from botocore.exceptions import BotoCoreError
    from botocore.parsers import ResponseParserError

    return (BotoCoreError, ResponseParserError)


def call_failure_line(error: Exception) -> str:
    """One line for a :func:`call_failures` error: what happened and what to do, without botocore's details."""
    what, remedy = describe_call_failure(error)
    return f"{what}: {remedy}"


def describe_call_failure(error: Exception) -> tuple[str, str]:
    """(what happened, what to do) of a :func:`call_failures` error, each one line."""
    from botocore.exceptions import NoCredentialsError
    from botocore.parsers import ResponseParserError

    if isinstance(error, NoCredentialsError):
        return "no AWS credentials found", NO_CREDENTIALS_REMEDY
    if isinstance(error, ResponseParserError):
        return "the answer is not in the service's format", NOT_AWS_REMEDY
    return _first_line(error), "retry when AWS answers"


def client_factory(region: str, *, purpose: str, credentials: dict[str, Any] | None = None) -> ClientFactory:
    """Clients of one checked session in ``region``, made once per service, bounded as the module says.

    Args:
        region: the AWS region of every client.
        purpose: the command, sent in the user agent (``btk-doctor``): CloudTrail shows who called.
        credentials: an STS ``Credentials`` answer to use instead of boto3's usual chain.

    Raises:
        AwsSetupError: the session cannot be made (see the module docstring).
    """
    from botocore.config import Config

    session = _session(region, credentials)
    config = Config(
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        retries={"mode": "standard", "max_attempts": BOTOCORE_MAX_ATTEMPTS},
        user_agent_extra=purpose,
    )
    made: dict[str, Any] = {}

    def client(service: str) -> Any:
        if service not in made:
            made[service] = _guarded(lambda: session.client(service, config=config))
            made[service].meta.events.register("before-parse", _refuse_an_empty_body)
        return made[service]

    return client


def _refuse_an_empty_body(operation_model: Any, response_dict: dict[str, Any], **_: Any) -> None:
    """A success answer of an operation that answers in its body, with no body: not AWS (a proxy, a stub).

    botocore reads an empty JSON body as ``{}``, which an operation without required members accepts as
    "nothing there": a report would then say no jobs exist.
    """
    from botocore.parsers import ResponseParserError

    shape = operation_model.output_shape
    answers_in_body = shape is not None and any(
        member.serialization.get("location") is None for member in shape.members.values()
    )
    if (
        answers_in_body
        and not operation_model.has_streaming_output
        and 200 <= response_dict["status_code"] < 300
        and response_dict["body"] == b""
    ):
        raise ResponseParserError(f"{operation_model.name} answered with an empty body")


def make_client(service: str, region: str, *, purpose: str) -> Any:
    """One client of :func:`client_factory`."""
    return client_factory(region, purpose=purpose)(service)


def _session(region: str, credentials: dict[str, Any] | None) -> Any:
    import boto3

    keys: dict[str, Any] = {}
    if credentials is not None:
        keys = {
            "aws_access_key_id": credentials["AccessKeyId"],
            "aws_secret_access_key": credentials["SecretAccessKey"],
            "aws_session_token": credentials["SessionToken"],
        }

    def make() -> Any:
        session = boto3.session.Session(region_name=region, **keys)
        _bound_credential_process(session)
        _resolved_credentials(session)
        return session

    return _guarded(make)


def _resolved_credentials(session: Any) -> Any:
    """The session's credentials, resolved now (SSO's are otherwise resolved at the first call)."""
    credentials = session.get_credentials()
    if credentials is None:
        raise AwsSetupError(NO_CREDENTIALS)
    return credentials.get_frozen_credentials()


class _BoundedPopen(subprocess.Popen[bytes]):
    """``subprocess.Popen`` whose ``communicate`` gives up after :data:`CREDENTIAL_PROCESS_TIMEOUT_S` and kills."""

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:
        try:
            return super().communicate(input, timeout=timeout or CREDENTIAL_PROCESS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            super().communicate()
            raise


def _bound_credential_process(session: Any) -> None:
    """Give the session's credential chain a ``credential_process`` provider that is bounded in time and
    whose malformed output (not JSON, not an object, not UTF-8) is botocore's CredentialRetrievalError."""
    from botocore.credentials import ProcessProvider
    from botocore.exceptions import CredentialRetrievalError

    class BoundedProcessProvider(ProcessProvider):  # type: ignore[misc]  # botocore is untyped
        def _retrieve_credentials_using(self, credential_process: str) -> dict[str, Any]:
            try:
                answer: dict[str, Any] = super()._retrieve_credentials_using(credential_process)
            except subprocess.TimeoutExpired:
                raise CredentialRetrievalError(
                    provider=self.METHOD,
                    error_msg=f"it did not answer within {CREDENTIAL_PROCESS_TIMEOUT_S} s (killed)",
                ) from None
            except OSError as error:  # not found, not executable
                raise CredentialRetrievalError(
                    provider=self.METHOD, error_msg=f"cannot run it ({error.strerror or error})"
                ) from None
            except (ValueError, AttributeError, TypeError) as error:  # JSONDecodeError, UnicodeDecodeError, a list
                raise CredentialRetrievalError(
                    provider=self.METHOD, error_msg=f"its output is not a JSON credentials document ({error})"
                ) from None
            return answer

    core = session._session  # boto3.Session wraps a botocore session; its credential chain is a component
    resolver = core.get_component("credential_provider")
    if resolver.get_provider("custom-process") is None:  # keys given explicitly: no chain to bound
        return
    unbounded = resolver.get_provider("custom-process")
    bounded = BoundedProcessProvider(
        profile_name=core.profile or "default", load_config=lambda: core.full_config, popen=_BoundedPopen
    )
    resolver.insert_before("custom-process", bounded)
    resolver.providers.remove(unbounded)


def _guarded(make: Callable[[], Any]) -> Any:
    """``make()``, its set-up failures raised as one :class:`AwsSetupError` line."""
    from botocore import exceptions as bex

    try:
        return make()
    except AwsSetupError:
        raise
    except bex.ProfileNotFound as error:
        raise AwsSetupError(
            f"AWS profile {error.kwargs.get('profile')!r} is not in {_config_file()} or {_credentials_file()}: "
            "set AWS_PROFILE to a profile there, or unset it"
        ) from None
    except bex.ConfigParseError as error:
        raise AwsSetupError(
            f"cannot parse the AWS config file {error.kwargs.get('path')}: fix it, or set AWS_CONFIG_FILE "
            "to another"
        ) from None
    except (bex.SSOTokenLoadError, bex.TokenRetrievalError, bex.UnauthorizedSSOTokenError, bex.SSOError) as error:
        raise AwsSetupError(
            f"the AWS SSO session has no valid token ({_first_line(error)}): run aws sso login"
            f"{_profile_flag()} and retry"
        ) from None
    except bex.CredentialRetrievalError as error:
        raise AwsSetupError(
            f"the credential_process of AWS profile {_profile_name()!r} failed: "
            f"{_first_line(error.kwargs.get('error_msg') or error)}: fix it in {_config_file()}"
        ) from None
    except bex.PartialCredentialsError as error:
        raise AwsSetupError(
            f"incomplete AWS credentials: {_first_line(error)}: set the missing one, or neither"
        ) from None
    except bex.NoCredentialsError:
        raise AwsSetupError(NO_CREDENTIALS) from None
    except ValueError as error:  # botocore: "Invalid endpoint: <url>"; InvalidRegionError is one too
        if "endpoint" in str(error).lower():
            raise AwsSetupError(
                f"{_first_line(error)}: AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_<SERVICE>, or the profile's "
                "endpoint_url) must be a URL such as https://host:port"
            ) from None
        raise AwsSetupError(f"cannot set up the AWS client: {_first_line(error)}") from None
    except bex.BotoCoreError as error:
        raise AwsSetupError(f"cannot set up the AWS client: {_first_line(error)}") from None


def _first_line(error: object) -> str:
    lines = str(error).strip().splitlines()
    return " ".join(lines[0].split()) if lines else type(error).__name__


def _config_file() -> str:
    return os.environ.get("AWS_CONFIG_FILE") or "~/.aws/config"


def _credentials_file() -> str:
    return os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials"


def _profile_name() -> str:
    """The profile botocore reads (its ``profile`` setting: AWS_DEFAULT_PROFILE, then AWS_PROFILE)."""
    return os.environ.get("AWS_DEFAULT_PROFILE") or os.environ.get("AWS_PROFILE") or "default"


def _profile_flag() -> str:
    name = _profile_name()
    return "" if name == "default" else f" --profile {name}"
