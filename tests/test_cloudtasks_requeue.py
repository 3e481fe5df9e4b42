"""``dlq requeue`` on Cloud Tasks: the audit headers are the README's names, their values percent-encoded outside
printable ASCII (a reason or ``--by`` beyond Latin-1 made a task the emulator could never deliver, its record
already deleted); the requeued task is delivered and its record deleted only after the task was created."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.support.backends import Backend
from tests.support.cloudtasks import (
    LOCATION,
    PROJECT,
    Emulator,
    dead_letters,
    post,
    refusing_server,
    task_headers,
)
from tests.test_cloudtasks_cli import cloudtasks_env
from worker.backends.cloudtasks.dlq import AUDIT_HEADERS, HEADER_SAFE, audit_headers
from worker.commands.__main__ import main
from worker.observability.events import Kind

README = Path(__file__).resolve().parents[1] / "README.md"
REASON = "héllo \u202e rtl 100%"
BY = "José Ω"


def test_audit_header_values_are_printable_ascii_and_decode_back() -> None:
    audit = {"requeued_by": BY, "requeued_at": "2026-12-01T00:00:00.000Z", "requeue_reason": REASON}
    headers = audit_headers(audit, "local-\udcff")
    assert set(headers) == set(AUDIT_HEADERS.values())
    for value in headers.values():
        assert value.isascii() and value.isprintable(), value
        assert all(char in HEADER_SAFE for char in value.replace("%", "")), value
    decoded = {name: unquote(value, errors="surrogatepass") for name, value in headers.items()}
    assert decoded == {
        "X-Worker-Requeued-By": BY,
        "X-Worker-Requeued-At": "2026-12-01T00:00:00.000Z",
        "X-Worker-Requeue-Reason": REASON,
        "X-Worker-Requeued-From": "local-\udcff",
    }
    assert audit_headers({"requeue_reason": "plain, ascii: kept"}, "t1")["X-Worker-Requeue-Reason"] == (
        "plain, ascii: kept"
    )


def test_the_readme_names_the_headers_requeue_sends() -> None:
    text = " ".join(README.read_text(encoding="utf-8").split())
    (sentence,) = re.findall(r"requeue adds the headers [^.]*", text)
    assert re.findall(r"`(X-Worker-[A-Za-z-]+)`", sentence) == list(AUDIT_HEADERS.values())


async def test_a_non_latin1_reason_is_requeued_and_delivered(
    backend: Backend,
    tasks_emulator: Emulator,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", backend.endpoint_url)
    async with refusing_server(backend.endpoint_url, tasks_emulator, tmp_path) as refusing:
        server, table, queue = refusing.server, refusing.table, refusing.queue
        status, _, _ = await asyncio.to_thread(post, server.url, b'{"type": "refuse"}', task_headers("t-refuse"))
        assert status == 200
        for name, value in cloudtasks_env(tasks_emulator, queue, table, server.port).items():
            monkeypatch.setenv(name, value)
        tasks_emulator.pause(queue)
        code = await asyncio.to_thread(main, ["dlq", "requeue", "t-refuse", "--reason", REASON, "--by", BY])
        out, err = capsys.readouterr()
        assert code == 0, err
        [task] = tasks_emulator.tasks(queue)
        headers = dict(task.http_request.headers)
        assert headers["X-Worker-Requeue-Reason"] == "h%C3%A9llo %E2%80%AE rtl 100%25"
        assert unquote(headers["X-Worker-Requeued-By"]) == BY
        assert await dead_letters(backend.endpoint_url, table, queue) == []  # deleted once the task existed
        path = f"projects/{PROJECT}/locations/{LOCATION}/queues/{queue}"
        await asyncio.to_thread(tasks_emulator.client().resume_queue, name=path)
        await server.recorder.wait_count(Kind.DEAD_LETTERED, 2, timeout_s=30)  # delivered, refused again
    [record] = await dead_letters(backend.endpoint_url, table, queue)
    assert record.task == task.name.rsplit("/", 1)[-1] and out.startswith(f"requeued t-refuse as {record.task}")
