"""`sqs-worker enqueue` validates the payload against the handler's model when WORKER_HANDLERS registers the type."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.backends import Backend
from tests.support.harness import drain, make_queues, sqs_client
from tests.support.process import ROOT, cli, worker_env
from tests.support.queues import message_count

HANDLERS = """
from pydantic import BaseModel
from worker import job


class Email(BaseModel):
    to: str
    subject: str = "Hi"


@job("send_email")
async def send_email(payload: Email) -> None:
    pass
"""


def test_enqueue_validates_a_registered_type_and_sends_others_as_given(backend: Backend, tmp_path: Path) -> None:
    (tmp_path / "cli_mail_jobs.py").write_text(HANDLERS)
    queues = make_queues(backend.endpoint_url)
    client = sqs_client(backend.endpoint_url)
    env = worker_env(
        backend.endpoint_url,
        WORKER_QUEUE=queues.queue_url,
        WORKER_HANDLERS="cli_mail_jobs",
        PYTHONPATH=f"{ROOT}:{tmp_path}",
        TMP=str(tmp_path),
    )
    bad = cli("enqueue", "send_email", "--payload", '{"to": 1}', env=env)
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.count("\n") == 1 and "payload invalid: to:" in bad.stderr and "nothing sent" in bad.stderr
    assert bad.stdout == ""
    assert message_count(client, queues.queue_url) == 0

    good = cli("enqueue", "send_email", "--payload", '{"to": "ada@example.com"}', env=env)
    other = cli("enqueue", "not_registered", "--payload", '{"to": 1}', env=env)
    unset = cli("enqueue", "send_email", "--payload", '{"to": 2}', env={**env, "WORKER_HANDLERS": ""})
    broken = cli("enqueue", "send_email", "--payload", '{"to": 3}', env={**env, "WORKER_HANDLERS": "no_such_jobs"})
    assert "note: payload not validated: WORKER_HANDLERS: no module 'no_such_jobs'" in broken.stderr
    for result in (good, other, unset, broken):
        assert result.returncode == 0, result.stderr
    bodies = sorted(
        (json.loads(m["Body"]) for m in drain(backend.endpoint_url, queues.queue_url, expect=4, timeout_s=5)),
        key=lambda b: (b["type"], json.dumps(b["payload"])),
    )
    assert bodies == [
        {"type": "not_registered", "payload": {"to": 1}},
        {"type": "send_email", "payload": {"to": "ada@example.com", "subject": "Hi"}},
        {"type": "send_email", "payload": {"to": 2}},
        {"type": "send_email", "payload": {"to": 3}},
    ]


def test_enqueue_refuses_a_payload_the_worker_would_dead_letter(backend: Backend) -> None:
    """An integer of more digits than Python converts, nesting deeper than the worker takes (shallow and deep enough
    to exhaust a parser's recursion), a lone surrogate: one line each, exit 2, nothing sent."""
    queues = make_queues(backend.endpoint_url)
    env = worker_env(backend.endpoint_url, WORKER_QUEUE=queues.queue_url)
    cases = {
        '{"n": ' + "9" * 5000 + "}": "an integer of more than 4300 digits",
        '{"a": ' + "[" * 150 + "]" * 150 + "}": "nests deeper than 100 levels",
        '{"a": ' + "[" * 20_000 + "]" * 20_000 + "}": "nests deeper than 100 levels",
        '{"s": "\\ud800"}': "not valid Unicode",
    }
    for payload, reason in cases.items():
        result = cli("enqueue", "echo", "--payload", payload, env=env)
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and reason in result.stderr and "nothing sent" in result.stderr
    assert message_count(sqs_client(backend.endpoint_url), queues.queue_url) == 0


def test_a_payload_too_large_for_an_argument_comes_from_stdin(backend: Backend) -> None:
    """``--payload -`` reads the payload from stdin: 200 KB, more than one argument may hold (128 KiB on Linux)."""
    queues = make_queues(backend.endpoint_url)
    env = worker_env(backend.endpoint_url, WORKER_QUEUE=queues.queue_url)
    payload = {"rows": ["x" * 1000] * 200}
    result = cli("enqueue", "import_rows", "--payload", "-", env=env, input=json.dumps(payload))
    assert result.returncode == 0, result.stderr
    [message] = drain(backend.endpoint_url, queues.queue_url, expect=1, timeout_s=5)
    assert json.loads(message["Body"]) == {"type": "import_rows", "payload": payload}
    bad = cli("enqueue", "import_rows", "--payload", "-", env=env, input="[1, 2")
    assert bad.returncode == 2 and "--payload is not JSON" in bad.stderr, bad.stderr
