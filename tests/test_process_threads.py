"""SIGTERM with plain ``def`` handlers still running, in a real ``sqs-worker run`` process: the exit does not
wait for their threads, and no job's effect happens twice."""

from __future__ import annotations

import json
import signal
import time
import uuid
from pathlib import Path

from tests.support.backends import Backend
from tests.support.harness import sqs_client
from tests.support.process import cli, lines, start, wait_until, worker_env
from worker.runtime.worker import THREAD_FINISH_WAIT_S

JOBS = 3


def in_queue(endpoint_url: str, queue_url: str) -> int:
    """Messages still in the queue: visible, in flight or delayed."""
    names = [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed",
    ]
    attributes = sqs_client(endpoint_url).get_queue_attributes(QueueUrl=queue_url, AttributeNames=names)["Attributes"]
    return sum(int(attributes[name]) for name in names)


def test_sigterm_with_slow_sync_jobs_exits_at_once_and_runs_each_effect_once(backend: Backend, tmp_path: Path) -> None:
    grace_s = 1.0
    effects = tmp_path / "effects.txt"
    env = worker_env(
        backend.endpoint_url,
        WORKER_QUEUE=f"threads-{uuid.uuid4().hex[:8]}",
        WORKER_HANDLERS="tests.support.handlers",
        WORKER_CONCURRENCY=str(JOBS),
        WORKER_VISIBILITY_TIMEOUT_S="5",
        WORKER_SHUTDOWN_GRACE_S=f"{grace_s:g}",
        TEST_EFFECTS_FILE=str(effects),
        TMP=str(tmp_path),
    )
    assert cli("bootstrap", env=env).returncode == 0
    url = sqs_client(backend.endpoint_url).get_queue_url(QueueName=env["WORKER_QUEUE"])["QueueUrl"]
    for n in range(JOBS):
        body = {"type": "slow_first", "payload": {"n": n, "seconds": 8}}
        sqs_client(backend.endpoint_url).send_message(QueueUrl=url, MessageBody=json.dumps(body))

    first_log = tmp_path / "first.log"
    worker = start("run", env=env, stderr_path=first_log)
    try:
        wait_until(lambda: sum(line.startswith("started") for line in lines(effects)) == JOBS, 30, "all jobs to start")
        stopping = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, first_log.read_text()
        exit_s = time.monotonic() - stopping
    finally:
        if worker.poll() is None:
            worker.kill()
    # The exit waits for the grace and the short wait for threads, not for the handlers (8 s).
    assert exit_s < grace_s + THREAD_FINISH_WAIT_S + 2, exit_s
    assert not any(line.startswith("finished") for line in lines(effects))  # the threads died with the process
    assert f"{JOBS} plain def handler(s) still run in threads" in first_log.read_text()

    # After a restart each message runs again (it was never released, it reappears after its visibility
    # timeout) and its effect happens once.
    second = start("run", env={**env, "WORKER_SHUTDOWN_GRACE_S": "30"}, stderr_path=tmp_path / "second.log")
    try:
        wait_until(lambda: sum(line.startswith("finished") for line in lines(effects)) >= JOBS, 40, "the reruns")
        wait_until(lambda: in_queue(backend.endpoint_url, url) == 0, 20, "the messages to be deleted")
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0
    done = lines(effects)
    for n in range(JOBS):
        assert done.count(f"finished {n}") == 1, done
        assert done.count(f"started {n} attempt=1") == 1, done
