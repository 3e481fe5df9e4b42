"""The email recipe against a local SMTP server (aiosmtpd) started by the test: sent once, 4xx retried, 5xx
dead-lettered, the provider's id and the template's version kept in the ledger."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.support.backends import Backend
from tests.support.harness import drain, make_queues, running_worker, send, sqs_client, start_warnings
from tests.support.idempotency import dynamodb_client
from tests.support.queues import assert_queue_empty
from tests.support.smtpserver import Mailbox, smtp_server
from worker.errors import PermanentError, RetryableError
from worker.idempotency import Ledger, create_table
from worker.jobs import Registry
from worker.observability.events import Kind
from worker.ops.bootstrap import Created
from worker.recipes import email as email_recipe
from worker.recipes.email import Template, provider_id, render, smtp_failure

TEMPLATES = """\
welcome:
  version: 3
  subject: "Welcome, $name"
  body: |
    Hello $name, your account $account is ready.
"""


def test_render_fills_variables_and_refuses_missing_ones() -> None:
    templates = {"welcome": Template(version=3, subject="Hi $name", body="Dear $name")}
    rendered = render(templates, "welcome", {"name": "Ada"})
    assert (rendered.subject, rendered.body, rendered.version) == ("Hi Ada", "Dear Ada", "3")
    with pytest.raises(PermanentError, match="needs variable 'name'"):
        render(templates, "welcome", {})
    with pytest.raises(PermanentError, match="no email template"):
        render(templates, "other", {})


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (421, RetryableError),
        (450, RetryableError),
        (451, RetryableError),
        (550, PermanentError),
        (553, PermanentError),
        (535, PermanentError),
    ],
)
def test_smtp_answers_sort_into_retry_and_permanent(code: int, kind: type[Exception]) -> None:
    assert isinstance(smtp_failure(code, "x"), kind)


def test_provider_id_is_read_from_the_data_answer() -> None:
    assert provider_id("2.0.0 Ok: queued as 4FJ8X1") == "4FJ8X1"
    assert provider_id("OK id=abc") == "OK id=abc"


@pytest_asyncio.fixture(loop_scope="function")
async def setup(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> AsyncIterator[tuple[Created, Ledger, Mailbox]]:
    templates = tmp_path / "templates.yaml"
    templates.write_text(TEMPLATES)
    table = f"em-{uuid.uuid4().hex[:10]}"
    with smtp_server() as mailbox:
        monkeypatch.setenv("WORKER_EMAIL_SENDER", "noreply@example.com")
        monkeypatch.setenv("WORKER_EMAIL_TEMPLATES", str(templates))
        monkeypatch.setenv("WORKER_EMAIL_SMTP_HOST", mailbox.host)
        monkeypatch.setenv("WORKER_EMAIL_SMTP_PORT", str(mailbox.port))
        async with dynamodb_client(backend.endpoint_url) as client:
            await create_table(client, table)
            yield make_queues(backend.endpoint_url, max_receive_count=20), Ledger(client, table, owner="t"), mailbox


def registry() -> Registry:
    jobs = Registry()
    email_recipe.register(jobs, backoff_base_s=0)
    return jobs


def job(to: str, event: str) -> dict[str, Any]:
    variables = {"name": "Ada", "account": "acc-1"}
    return {"type": "email", "payload": {"to": to, "template": "welcome", "event": event, "variables": variables}}


async def test_a_temporary_refusal_is_retried_and_duplicates_never_send_twice(
    backend: Backend, setup: tuple[Created, Ledger, Mailbox]
) -> None:
    queues, ledger, mailbox = setup
    mailbox.refuse_next("451 4.3.0 try again later")
    for _ in range(3):  # one event enqueued three times: one mail
        send(backend.endpoint_url, queues.queue_url, job("ada@example.com", "signup:1"))
    async with running_worker(backend.endpoint_url, queues, registry(), ledger=ledger, visibility_timeout_s=5) as run:
        await run.recorder.wait_count(Kind.RETRY_SCHEDULED, 1)
        await run.recorder.wait_count(Kind.SUCCEEDED, 1)
        await run.recorder.wait_for(lambda r: len(r.of(Kind.DUPLICATE_SKIPPED)) >= 2, timeout_s=60)
    assert len(mailbox.accepted) == 1
    [mail] = mailbox.accepted
    assert (mail["To"], mail["Subject"], mail["X-Template"]) == ("ada@example.com", "Welcome, Ada", "welcome/3")
    assert "your account acc-1 is ready" in mail.get_payload()
    record = await ledger.get("email:ada@example.com:welcome:signup:1")
    assert record is not None and record.result is not None
    assert record.result["provider_id"] == "TEST0001"
    assert (record.result["template"], record.result["version"]) == ("welcome", "3")
    assert record.result["message_id"] == mail["Message-ID"]
    assert_queue_empty(sqs_client(backend.endpoint_url), queues.queue_url)


async def test_a_refused_recipient_is_dead_lettered(backend: Backend, setup: tuple[Created, Ledger, Mailbox]) -> None:
    queues, ledger, mailbox = setup
    mailbox.refuse_next("550 5.1.1 no such user")
    send(backend.endpoint_url, queues.queue_url, job("nobody@example.com", "signup:2"))
    async with running_worker(backend.endpoint_url, queues, registry(), ledger=ledger) as run:
        await run.recorder.wait_count(Kind.DEAD_LETTERED, 1)
    [dead] = drain(backend.endpoint_url, queues.dlq_url, expect=1)
    assert dead["MessageAttributes"]["error_message"]["StringValue"] == "PermanentError: SMTP 550: 5.1.1 no such user"
    assert mailbox.accepted == []


async def test_a_message_that_can_never_be_built_is_dead_lettered_at_once(
    backend: Backend, setup: tuple[Created, Ledger, Mailbox]
) -> None:
    """A line break in a header (a variable carrying "\\r\\nBcc: ..."): refused, never sent, and not retried 8
    times over a quarter of an hour before it is called exhausted."""
    queues, ledger, mailbox = setup
    error = "PermanentError: the message cannot be built: "
    body = job("ada@example.com", "signup:3")
    body["payload"]["variables"]["name"] = "Ada\r\nBcc: victim@example.org"
    send(backend.endpoint_url, queues.queue_url, body)
    async with running_worker(backend.endpoint_url, queues, registry(), ledger=ledger) as run:
        await run.recorder.wait_count(Kind.DEAD_LETTERED, 1)
    assert not run.recorder.of(Kind.RETRY_SCHEDULED)
    [dead] = drain(backend.endpoint_url, queues.dlq_url, expect=1)
    assert dead["MessageAttributes"]["error_category"]["StringValue"] == "permanent"
    assert dead["MessageAttributes"]["error_message"]["StringValue"].startswith(error)
    assert mailbox.accepted == []


async def test_the_start_warns_when_sender_or_templates_are_not_set(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    jobs = Registry()
    email_recipe.register(jobs)
    monkeypatch.chdir(tmp_path)  # no .env here
    monkeypatch.delenv("WORKER_EMAIL_TEMPLATES", raising=False)
    monkeypatch.setenv("WORKER_EMAIL_SENDER", "shop@example.com")
    [warning] = await start_warnings(jobs, caplog)
    assert warning == (
        "job 'email': set WORKER_EMAIL_SENDER and WORKER_EMAIL_TEMPLATES to send email; each of its jobs is "
        "dead-lettered (permanent) until they are set"
    )
    monkeypatch.setenv("WORKER_EMAIL_TEMPLATES", str(tmp_path))
    assert await start_warnings(jobs, caplog) == []
