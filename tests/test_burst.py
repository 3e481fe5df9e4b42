"""``sqs-worker run --burst`` as a real process: it drains the queue (retries included), summarises, exits."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.backends import Backend
from tests.support.harness import drain, sqs_client
from tests.support.process import ROOT, bootstrapped_queue, cli, lines, wait_until
from tests.support.queues import assert_queue_empty, queue_counts
from worker.errors import ConfigError
from worker.runtime.burst import Burst, burst_settings, idle_limit_s
from worker.runtime.service import run_loop
from worker.settings import WorkerSettings


def burst_env(backend: Backend, tmp_path: Path, **settings: str) -> tuple[dict[str, str], str]:
    return bootstrapped_queue(
        backend.endpoint_url, tmp_path, handlers="tests.support.burst_handlers", prefix="burst", **settings
    )


def summary_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("burst ")]


def test_burst_drains_the_queue_waits_for_retries_and_exits_0(backend: Backend, tmp_path: Path) -> None:
    env, url = burst_env(backend, tmp_path, WORKER_METRICS="emf")  # the default: EMF lines on stdout too
    client = sqs_client(backend.endpoint_url)
    bodies = [{"type": "ok", "payload": {"n": n}} for n in range(3)] + [{"type": "flaky"}, {"type": "refused"}]
    for body in bodies:
        client.send_message(QueueUrl=url, MessageBody=json.dumps(body))
    client.send_message(QueueUrl=url, MessageBody=json.dumps({"type": "ok", "payload": {"n": 3}}), DelaySeconds=2)
    result = cli("run", "--burst", env=env, timeout_s=90)
    assert result.returncode == 0, result.stderr
    assert summary_lines(result.stdout) == ["burst done: 5 succeeded, 1 retried, 1 dead-lettered; queue empty"]
    *metrics, last = result.stdout.splitlines()
    assert last == "burst done: 5 succeeded, 1 retried, 1 dead-lettered; queue empty"  # the last line, as promised
    assert metrics and all("_aws" in json.loads(line) for line in metrics)  # before it: only EMF documents
    assert sorted(lines(tmp_path / "effects.txt")) == [
        "flaky attempt=1",
        "flaky attempt=2",  # its retry delay (2 s) was waited for
        "ok 0",
        "ok 1",
        "ok 2",
        "ok 3",  # the delayed message too
        "refused",
    ]
    assert_queue_empty(client, url)
    (dead,) = drain(backend.endpoint_url, url + "-dlq", expect=1)
    assert dead["MessageAttributes"]["error_category"]["StringValue"] == "permanent"


@pytest.mark.parametrize(("event_loop", "module"), [("uvloop", "uvloop"), ("asyncio", "asyncio.unix_events")])
def test_the_event_loop_is_the_one_worker_event_loop_names(
    backend: Backend, tmp_path: Path, event_loop: str, module: str
) -> None:
    env, url = burst_env(backend, tmp_path, WORKER_EVENT_LOOP=event_loop)
    client = sqs_client(backend.endpoint_url)
    for _ in range(3):
        client.send_message(QueueUrl=url, MessageBody=json.dumps({"type": "loop"}))
    result = cli("run", "--burst", env=env, timeout_s=90)
    assert result.returncode == 0, result.stderr
    assert summary_lines(result.stdout) == ["burst done: 3 succeeded, 0 retried, 0 dead-lettered; queue empty"]
    assert lines(tmp_path / "effects.txt") == [f"loop {module}"] * 3
    assert_queue_empty(client, url)


def test_uvloop_asked_for_but_not_installed_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # what an install without the extra looks like to import
    ran: list[bool] = []

    async def main() -> None:
        ran.append(True)

    with pytest.raises(ConfigError, match=r"pip install '/path/to/sqs-worker\[uvloop\]'"):
        run_loop(WorkerSettings(queue="q", event_loop="uvloop"), main())
    assert ran == []


@pytest.mark.parametrize("processes", ["1", "2"])
def test_burst_on_an_empty_queue_exits_at_once(backend: Backend, tmp_path: Path, processes: str) -> None:
    # A burst is one process, whatever the setting; its long polls last 1 s, whatever WORKER_POLL_WAIT_S says.
    env, _ = burst_env(backend, tmp_path, WORKER_PROCESSES=processes, WORKER_POLL_WAIT_S="20")
    started = time.monotonic()
    result = cli("run", "--burst", env=env, timeout_s=60)
    assert result.returncode == 0, result.stderr
    assert summary_lines(result.stdout) == ["burst done: 0 succeeded, 0 retried, 0 dead-lettered; queue empty"]
    assert time.monotonic() - started < 30  # a few polls, not a wait for the bound
    # Its receives long-poll 1 s, not WORKER_POLL_WAIT_S (20): when it ends, the polls it abandons close within a
    # second at SQS, instead of taking a job sent meanwhile for a visibility timeout (and counting a run).
    assert "long polls of 1 s" in result.stderr


def test_a_burst_long_polls_at_most_a_second() -> None:
    assert burst_settings(WorkerSettings(queue="q")).poll_wait_s == 1
    assert burst_settings(WorkerSettings(queue="q", poll_wait_s=0)).poll_wait_s == 0


def test_burst_gives_up_on_a_message_it_cannot_get_and_exits_1(backend: Backend, tmp_path: Path) -> None:
    """A message in flight at another consumer for longer than the bound: the burst says so and exits 1."""
    env, url = burst_env(backend, tmp_path, WORKER_VISIBILITY_TIMEOUT_S="5")
    client = sqs_client(backend.endpoint_url)
    client.send_message(QueueUrl=url, MessageBody=json.dumps({"type": "ok", "payload": {"n": 1}}))
    held = client.receive_message(QueueUrl=url, VisibilityTimeout=300, WaitTimeSeconds=1).get("Messages", [])
    assert len(held) == 1
    limit_s = idle_limit_s(visibility_timeout_s=5, backoff_max_s=1, poll_wait_s=1)
    result = cli("run", "--burst", env=env, timeout_s=90)
    assert result.returncode == 1, result.stderr
    assert summary_lines(result.stdout) == [
        "burst stopped: 0 succeeded, 0 retried, 0 dead-lettered; 1 left in the queue (0 visible, 1 in flight, "
        f"0 delayed) after {limit_s:g} s without a message"
    ]
    assert queue_counts(client, url)["ApproximateNumberOfMessagesNotVisible"] == 1
    assert lines(tmp_path / "effects.txt") == []


def test_burst_waits_for_the_jobs_its_own_rate_limit_held_back(backend: Backend, tmp_path: Path) -> None:
    """A hold the worker set itself (here about 12 s, longer than the 6 s idle bound) is its own job to run: the burst
    waits for it (it gave up with exit 1, "1 left ... 1 delayed")."""
    env, url = bootstrapped_queue(
        backend.endpoint_url,
        tmp_path,
        handlers="tests.support.burst_limited",
        prefix="burst",
        WORKER_VISIBILITY_TIMEOUT_S="5",
    )
    client = sqs_client(backend.endpoint_url)
    for n in range(2):
        client.send_message(QueueUrl=url, MessageBody=json.dumps({"type": "limited", "payload": {"n": n}}))
    assert idle_limit_s(visibility_timeout_s=5, backoff_max_s=1, poll_wait_s=1) < 12
    result = cli("run", "--burst", env=env, timeout_s=90)
    assert result.returncode == 0, result.stdout + result.stderr
    assert summary_lines(result.stdout) == ["burst done: 2 succeeded, 0 retried, 0 dead-lettered; queue empty"]
    assert sorted(lines(tmp_path / "effects.txt")) == ["limited 0", "limited 1"]
    assert_queue_empty(client, url)


def test_a_signal_ends_a_burst_after_the_running_job_with_exit_0(backend: Backend, tmp_path: Path) -> None:
    env, url = burst_env(backend, tmp_path)
    client = sqs_client(backend.endpoint_url)
    client.send_message(QueueUrl=url, MessageBody=json.dumps({"type": "nap", "payload": {"seconds": 3}}))
    effects = tmp_path / "effects.txt"
    with (tmp_path / "worker.log").open("wb") as stderr:
        worker = subprocess.Popen(
            [sys.executable, "-m", "worker.commands", "run", "--burst"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            cwd=ROOT,
            text=True,
        )
    try:
        wait_until(lambda: "nap started" in lines(effects), 30, "the job to start")
        worker.send_signal(signal.SIGTERM)
        stdout, _ = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0, (tmp_path / "worker.log").read_text()
    assert summary_lines(stdout) == ["burst stopped by a signal: 1 succeeded, 0 retried, 0 dead-lettered"]
    assert lines(effects) == ["nap started", "nap done"]
    assert_queue_empty(client, url)


def test_the_summary_counts_duplicates_skipped_when_there_are_any() -> None:
    from worker.jobs import Registry
    from worker.observability.events import Event, Kind
    from worker.settings import WorkerSettings

    burst = Burst(WorkerSettings(queue="q"), Registry(), clock=lambda: 0.0)
    burst.empty = True
    burst.emit(Event(Kind.SUCCEEDED, "q", "m-1"))
    assert burst.summary() == "burst done: 1 succeeded, 0 retried, 0 dead-lettered; queue empty"  # as before
    burst.emit(Event(Kind.DUPLICATE_SKIPPED, "q", "m-2"))
    assert burst.summary() == "burst done: 1 succeeded, 0 retried, 0 dead-lettered, 1 duplicate skipped; queue empty"
    burst.emit(Event(Kind.DUPLICATE_SKIPPED, "q", "m-3"))
    assert burst.summary().endswith(", 2 duplicates skipped; queue empty")
