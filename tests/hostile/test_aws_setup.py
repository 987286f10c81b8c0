"""Every command that calls AWS, driven through a hostile AWS set-up: one line each, exit 2, bounded time.

The set-ups are what a user's machine can hold: a named profile in neither file, a config file that does
not parse, a ``credential_process`` that fails, prints something other than its JSON document, does not
exist or never answers, an SSO profile without a token, an endpoint that is not a URL, and an endpoint
that answers 200 with an empty body (a proxy, a stub). The commands run in-process with a fixture catalog
(tests/hostile/cli_fixtures.py) and real boto3 sessions: nothing is stubbed between btk and botocore.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cli_fixtures import ENVIRONMENTS, PROFILE, assert_one_line_error, btk

from btk import aws_clients, capacity, catalog

ENV = "hostile-od"
COMMANDS = {
    "doctor": ["doctor", "--env", ENV],
    "capacity": ["capacity", "search", "--env", ENV, "--profile", PROFILE.name],
    "report": ["report", "--env", ENV],
}
#: The credential process's bound in these tests (the shipped one is a minute).
PROCESS_TIMEOUT_S = 1
#: What a command may take at most here: the bound above and botocore's start-up, with room for a busy machine.
BOUND_S = 30


@dataclass(frozen=True)
class Setup:
    """An AWS set-up: ``~/.aws/config``'s text, the variables set, and what the one line must say."""

    config: str
    variables: dict[str, str]
    says: tuple[str, ...]


def _process(code: str) -> str:
    """A credential_process line running ``code`` with this Python."""
    return f'credential_process = {sys.executable} -c "{code}"'


PROFILE_CONFIG = "[profile hostile]\nregion = us-east-1\n"
KEYS = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"}
SETUPS = {
    "named profile missing": Setup("", {"AWS_PROFILE": "nope"}, ("AWS profile 'nope' is not in",)),
    "config file broken": Setup("[profile hostile\nregion us-east-1\n", {"AWS_PROFILE": "hostile"},
                                ("cannot parse the AWS config file",)),
    "process fails": Setup(PROFILE_CONFIG + _process("import sys; sys.exit('token expired')"),
                           {"AWS_PROFILE": "hostile"}, ("credential_process of AWS profile 'hostile' failed",)),
    "process prints garbage": Setup(PROFILE_CONFIG + _process("print('<html>sign in</html>')"),
                                    {"AWS_PROFILE": "hostile"}, ("not a JSON credentials document",)),
    "process prints a list": Setup(PROFILE_CONFIG + _process("print([1, 2])"), {"AWS_PROFILE": "hostile"},
                                   ("not a JSON credentials document",)),
    "process missing": Setup(PROFILE_CONFIG + "credential_process = /nonexistent/aws-vault export\n",
                             {"AWS_PROFILE": "hostile"}, ("credential_process of AWS profile 'hostile' failed",
                                                          "cannot run it")),
    "process hangs": Setup(PROFILE_CONFIG + _process("import time; time.sleep(600)"), {"AWS_PROFILE": "hostile"},
                           (f"did not answer within {PROCESS_TIMEOUT_S} s",)),
    "sso without a token": Setup(
        "[profile hostile]\nsso_session = corp\nsso_account_id = 123456789012\nsso_role_name = Trainer\n"
        "region = us-east-1\n[sso-session corp]\nsso_start_url = https://example.awsapps.com/start\n"
        "sso_region = us-east-1\n", {"AWS_PROFILE": "hostile"}, ("aws sso login --profile hostile",)),
    "no credentials": Setup("", {}, ("no AWS credentials found",)),
    "endpoint not a URL": Setup("", {**KEYS, "AWS_ENDPOINT_URL": "not a url"}, ("AWS_ENDPOINT_URL",)),
}


class _EmptyOk(BaseHTTPRequestHandler):
    """Answers every request 200 with an empty body, as a misconfigured proxy or stub does."""

    def _empty(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = _empty  # noqa: N815 - BaseHTTPRequestHandler's method names

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture(scope="module")
def empty_ok() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EmptyOk)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[[Setup], None]:
    """The fixture catalog, no AWS variable of this machine, ``HOME`` empty (no SSO token cache)."""
    monkeypatch.setattr(catalog, "all_profiles", lambda: {PROFILE.name: PROFILE})
    monkeypatch.setattr(catalog, "all_environments", lambda: dict(ENVIRONMENTS))
    monkeypatch.setattr(capacity, "plan_instance_types", lambda: ("ml.p6-b200.48xlarge",))
    monkeypatch.setattr(aws_clients, "CREDENTIAL_PROCESS_TIMEOUT_S", PROCESS_TIMEOUT_S)
    monkeypatch.setattr(time, "sleep", lambda seconds: None)  # the commands' own retry pauses
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))

    def apply(setup: Setup) -> None:
        config = tmp_path / "config"
        config.write_text(setup.config)
        monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
        for name, value in setup.variables.items():
            monkeypatch.setenv(name, value)

    return apply


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("name", sorted(SETUPS))
def test_a_broken_aws_setup_is_one_line_naming_what_to_fix(
    name: str, command: str, isolated: Callable[[Setup], None], capsys: pytest.CaptureFixture[str]
) -> None:
    setup = SETUPS[name]
    isolated(setup)
    started = time.monotonic()
    outcome = btk(capsys, COMMANDS[command])
    assert time.monotonic() - started < BOUND_S
    assert_one_line_error(outcome)
    for phrase in setup.says:
        assert phrase in outcome.err, outcome.err


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_endpoint_answering_empty_200s_is_one_line(
    command: str, empty_ok: str, isolated: Callable[[Setup], None], capsys: pytest.CaptureFixture[str]
) -> None:
    isolated(Setup("", {**KEYS, "AWS_ENDPOINT_URL": empty_ok}, ()))
    outcome = btk(capsys, COMMANDS[command])
    assert_one_line_error(outcome)
    assert "documented shape" in outcome.err or "not in the service's format" in outcome.err, outcome.err


def test_a_hung_credential_process_is_killed(
    isolated: Callable[[Setup], None], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The process that did not answer is gone when the command has said so (no orphan left waiting)."""
    marker = tmp_path / "pid"
    code = f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    isolated(Setup(PROFILE_CONFIG + _process(code), {"AWS_PROFILE": "hostile"}, ()))
    assert_one_line_error(btk(capsys, COMMANDS["doctor"]))
    pid = int(marker.read_text())
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
