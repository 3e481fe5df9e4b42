"""One edge, one voice (issue 9, item 8): every command answers a wrong endpoint, refused credentials, denied
access and a missing queue with one line that names it, exit 2.

The wrong endpoint is a closed port; refused credentials and denied access come from a tiny server answering
AWS-style errors (moto accepts anything); the missing queue from a real moto server.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.backends import Backend
from tests.support.errorserver import Answer, error_server
from tests.support.logs import root_logging_restored
from tests.support.process import cli, worker_env
from worker.commands.__main__ import main
from worker.dev.localaws import free_port

ROOT = Path(__file__).resolve().parents[1]
SCHEDULES = str(ROOT / "schedules.example.yaml")

#: Every command that speaks to AWS, as a user types it (``run`` is tested as a process below).
COMMANDS = {
    "bootstrap": ["bootstrap"],
    "enqueue": ["enqueue", "send_email", "--payload", "{}"],
    "stats": ["stats"],
    "status": ["status", "some-key"],
    "schedules fire": ["schedules", "fire", "cache-refresh", "--file", SCHEDULES],
    "dlq list": ["dlq", "list"],
    "dlq show": ["dlq", "show", "some-id"],
    "dlq redrive": ["dlq", "redrive", "--yes"],
    "dlq requeue": ["dlq", "requeue", "some-id", "--reason", "r"],
    "dlq purge": ["dlq", "purge", "--yes"],
}


@dataclass(frozen=True)
class Situation:
    name: str
    endpoint_url: str
    names: tuple[str, ...]  # what the line must name (any of them)


@pytest.fixture(params=["wrong endpoint", "web page", "refused credentials", "access denied", "missing queue"])
def situation(request: pytest.FixtureRequest) -> Iterator[Situation]:
    if request.param == "wrong endpoint":
        port = free_port()  # bound and closed again: nothing listens there
        yield Situation(request.param, f"http://127.0.0.1:{port}", (f"127.0.0.1:{port}",))
    elif request.param == "web page":  # AWS_ENDPOINT_URL names a web server: its 404 page
        with error_server(Answer(404, "")) as server:
            yield Situation(request.param, server.url, (server.url,))
    elif request.param == "refused credentials":
        with error_server(Answer(403, "InvalidClientTokenId")) as server:
            yield Situation(request.param, server.url, ("InvalidClientTokenId",))
    elif request.param == "access denied":
        with error_server(Answer(400, "AccessDenied")) as server:
            yield Situation(request.param, server.url, ("AccessDenied",))
    else:
        moto: Backend = request.getfixturevalue("moto_backend")
        names: tuple[str, str] = request.getfixturevalue("names")
        yield Situation(request.param, moto.endpoint_url, names)


@pytest.fixture
def names() -> tuple[str, str]:
    """A queue and a table no test created (a test's bootstrap creates them on the shared moto server)."""
    suffix = uuid.uuid4().hex[:8]
    return f"edge-{suffix}", f"edge-table-{suffix}"


@pytest.fixture(autouse=True)
def environment(monkeypatch: pytest.MonkeyPatch, names: tuple[str, str]) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith("WORKER_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("WORKER_QUEUE", names[0])
    monkeypatch.setenv("WORKER_IDEMPOTENCY_TABLE", names[1])
    monkeypatch.setenv("WORKER_LOG_LEVEL", "WARNING")
    with root_logging_restored():
        yield


def assert_one_line(stderr: str, situation: Situation) -> str:
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"{situation.name}: expected one line, got {len(lines)}:\n{stderr}"
    line = lines[0]
    assert line.startswith("sqs-worker: error: "), line
    assert any(name in line for name in situation.names), f"{situation.name}: {line!r} names none of {situation.names}"
    assert len(line) < 400, line
    return line


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_command_says_what_is_wrong_in_one_line(
    command: str, situation: Situation, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", situation.endpoint_url)
    code = main(COMMANDS[command])
    _, err = capsys.readouterr()
    if situation.name == "missing queue" and command == "bootstrap":
        assert code == 0, err  # bootstrap creates what is missing
        return
    assert code == 2, f"{command} / {situation.name}: exit {code}\n{err}"
    line = assert_one_line(err, situation)
    if situation.name == "wrong endpoint":
        assert "cannot reach" in line
    elif situation.name == "web page":
        assert "HTTP 404 (Oops)" in line and "not an AWS answer: check AWS_ENDPOINT_URL" in line
    elif situation.name == "refused credentials":
        assert "credentials" in line
    elif situation.name == "access denied":
        assert "access denied" in line
    else:
        assert "does not exist" in line


def test_run_says_what_is_wrong_in_one_line(situation: Situation, names: tuple[str, str], tmp_path: Path) -> None:
    env = worker_env(
        situation.endpoint_url,
        TMP=str(tmp_path),
        WORKER_QUEUE=names[0],
        WORKER_HANDLERS="tests.support.handlers",
        WORKER_START_TIMEOUT_S="1",
        WORKER_LOG_LEVEL="ERROR",
    )
    done = cli("run", env=env, timeout_s=60)
    assert done.returncode == 2, done.stderr
    assert_one_line(done.stderr, situation)
