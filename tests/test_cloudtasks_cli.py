"""The CLI on the Cloud Tasks backend: bootstrap, enqueue, serve-tasks as a process (SIGTERM mid-job), and the
dlq commands on the dead-letter table; the emulator as Cloud Tasks, the tables on the backend."""

from __future__ import annotations

import asyncio
import json
import signal
import urllib.request
from pathlib import Path

import pytest

from tests.support.backends import Backend
from tests.support.cloudtasks import (
    LOCATION,
    PROJECT,
    SECRET,
    Emulator,
    dead_letters,
    post,
    refusing_server,
    task_headers,
)
from tests.support.process import cli, lines, start, wait_until, worker_env
from worker.commands.__main__ import main
from worker.dev.localaws import free_port


def cloudtasks_env(emulator: Emulator, queue: str, table: str, port: int, **more: str) -> dict[str, str]:
    return {
        "WORKER_BACKEND": "cloudtasks",
        "WORKER_QUEUE": queue,
        "WORKER_CLOUDTASKS_PROJECT": PROJECT,
        "WORKER_CLOUDTASKS_LOCATION": LOCATION,
        "WORKER_CLOUDTASKS_URL": f"http://127.0.0.1:{port}/tasks",
        "WORKER_CLOUDTASKS_HOST": "127.0.0.1",
        "WORKER_CLOUDTASKS_PORT": str(port),
        "WORKER_CLOUDTASKS_SHARED_SECRET": SECRET,
        "WORKER_CLOUDTASKS_EMULATOR_HOST": emulator.host,
        "WORKER_CLOUDTASKS_DEAD_LETTER_TABLE": table,
        "WORKER_CLOUDTASKS_MAX_ATTEMPTS": "3",
        **more,
    }


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def test_serve_tasks_process_finishes_the_running_job_on_sigterm(
    backend: Backend, tasks_emulator: Emulator, tmp_path: Path
) -> None:
    queue = tasks_emulator.new_queue()
    port = free_port()
    effects = tmp_path / "effects"
    table = f"dead-letters-{queue}"
    env = worker_env(
        backend.endpoint_url,
        TMP=str(tmp_path),
        WORKER_HANDLERS="tests.support.handlers",
        WORKER_SHUTDOWN_GRACE_S="20",
        TEST_EFFECTS_FILE=str(effects),
        **cloudtasks_env(tasks_emulator, queue, table, port),
    )
    made = cli("bootstrap", env=env)
    assert made.returncode == 0, made.stderr
    assert f"dead-letter table: {table} (created)" in made.stdout
    process = start("serve-tasks", env=env, stderr_path=tmp_path / "stderr")
    try:
        wait_until(lambda: ready(port), 30, "serve-tasks ready")
        sent = cli("enqueue", "slow", "--payload", '{"n": 1, "seconds": 2}', env=env)
        assert sent.returncode == 0, sent.stderr
        assert sent.stdout.startswith(f"projects/{PROJECT}/locations/{LOCATION}/queues/{queue}/tasks/")
        wait_until(lambda: "started 1" in lines(effects), 30, "the job to start")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, (tmp_path / "stderr").read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    assert lines(effects) == ["started 1", "finished 1"]
    assert tasks_emulator.tasks(queue) == []  # answered 2xx before the server closed
    keyed = cli("enqueue", "record", "--idempotency-key", "order-9", env=env)
    again = cli("enqueue", "record", "--idempotency-key", "order-9", env=env)
    assert keyed.returncode == again.returncode == 0
    assert keyed.stdout == again.stdout  # the same task name: Cloud Tasks deduplicates it (the emulator does not)


async def test_dlq_commands_on_the_dead_letter_table(
    backend: Backend,
    tasks_emulator: Emulator,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", backend.endpoint_url)
    async with refusing_server(backend.endpoint_url, tasks_emulator, tmp_path) as refusing:
        server, table, queue = refusing.server, refusing.table, refusing.queue
        for name, body in (("t-refuse", b'{"type": "refuse"}'), ("t-bad", b"not json"), ("t-other", b"[]")):
            status, _, _ = await asyncio.to_thread(post, server.url, body, task_headers(name))
            assert status == 200
    for name, value in cloudtasks_env(tasks_emulator, queue, table, 8080).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LOGNAME", "pytest-operator")
    tasks_emulator.pause(queue)  # the replayed tasks stay in the queue to be looked at

    def run(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    code, out, _ = await asyncio.to_thread(run, "dlq", "list")
    assert code == 0
    assert "invalid_message" in out and "permanent" in out and f"dead-letter table: {table}" in out
    code, out, _ = await asyncio.to_thread(run, "dlq", "list", "--json")
    groups = sorted((g["category"], g["count"]) for g in json.loads(out)["groups"])
    assert groups == [("invalid_message", 1), ("invalid_message", 1), ("permanent", 1)]  # grouped by error too
    code, out, _ = await asyncio.to_thread(run, "dlq", "show", "t-refuse")
    shown = json.loads(out)
    assert (code, shown["category"], shown["job_type"], shown["body"]) == (
        0,
        "permanent",
        "refuse",
        '{"type": "refuse"}',
    )
    assert (await asyncio.to_thread(run, "dlq", "show", "missing"))[0] == 3
    code, out, _ = await asyncio.to_thread(run, "dlq", "requeue", "t-refuse", "--reason", "account fixed")
    assert code == 0 and out.startswith("requeued t-refuse as ")
    [task] = tasks_emulator.tasks(queue)
    headers = dict(task.http_request.headers)
    assert headers["X-Worker-Requeued-By"] == "pytest-operator"
    assert headers["X-Worker-Requeue-Reason"] == "account fixed"
    assert headers["X-Worker-Requeued-From"] == "t-refuse"
    assert task.http_request.body == b'{"type": "refuse"}'
    code, out, _ = await asyncio.to_thread(run, "dlq", "redrive", "--yes")
    assert code == 0 and "moved 2 of 2" in out
    assert sorted(t.http_request.body for t in tasks_emulator.tasks(queue)) == [
        b"[]",
        b"not json",
        b'{"type": "refuse"}',
    ]
    assert await dead_letters(backend.endpoint_url, table, queue) == []
    assert (await asyncio.to_thread(run, "dlq", "purge"))[0] == 2
    code, out, _ = await asyncio.to_thread(run, "dlq", "purge", "--yes")
    assert (code, out.strip()) == (0, f"purged 0 dead letter(s) of {queue} from {table}")
