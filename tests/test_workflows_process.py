"""A group run by real ``sqs-worker run`` processes, one of them SIGKILLed mid-group; ``sqs-worker status``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from pathlib import Path

import boto3

from tests.support.backends import Backend
from tests.support.harness import make_queues, sqs_client
from tests.support.process import cli, lines, start, wait_until, worker_env
from tests.support.queues import message_count
from worker.producer import Job
from worker.workflows import group

MEMBERS = 12


def test_sigkill_of_a_worker_mid_group_still_sends_the_callback_once(backend: Backend, tmp_path: Path) -> None:
    queues = make_queues(backend.endpoint_url, max_receive_count=30)
    table = f"wfp-{uuid.uuid4().hex[:10]}"
    effects = tmp_path / "effects.txt"
    env = worker_env(
        backend.endpoint_url,
        TMP=str(tmp_path),
        WORKER_QUEUE=queues.queue_url,
        WORKER_HANDLERS="tests.support.workflow_handlers",
        WORKER_IDEMPOTENCY_TABLE=table,
        WORKER_VISIBILITY_TIMEOUT_S="5",
        WORKER_CONCURRENCY="3",
        TEST_EFFECTS_FILE=str(effects),
    )
    assert cli("bootstrap", env=env).returncode == 0  # creates the table (the queues exist)
    dynamodb = boto3.client("dynamodb", endpoint_url=backend.endpoint_url, region_name="us-east-1")
    flow = group([Job("wf_member", {"i": i, "seconds": 0.4}) for i in range(MEMBERS)], callback=Job("wf_collect"))
    workflow_id = flow.start(
        sqs=sqs_client(backend.endpoint_url), dynamodb=dynamodb, queue=queues.queue_url, table=table
    )
    before = cli("status", workflow_id, "--json", env=env)
    assert json.loads(before.stdout)["done"] == 0, before.stderr

    processes = [start("run", env=env, stderr_path=tmp_path / f"worker-{i}.log") for i in range(2)]
    try:
        wait_until(lambda: len([x for x in lines(effects) if x.startswith("member")]) >= 3, 60, "a few members")
        victim = processes[0]
        victim.send_signal(signal.SIGKILL)  # mid-group: its running members reappear after their visibility
        victim.wait(timeout=10)
        wait_until(lambda: any(x.startswith("callback") for x in lines(effects)), 90, "the callback")
        wait_until(
            lambda: message_count(sqs_client(backend.endpoint_url), queues.queue_url) == 0, 60, "a drained queue"
        )
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
    callbacks = [x for x in lines(effects) if x.startswith("callback")]
    assert len(callbacks) == 1, callbacks
    assert callbacks[0].startswith("callback " + json.dumps(list(range(MEMBERS))))
    members = {int(x.split()[1]) for x in lines(effects) if x.startswith("member")}
    assert members == set(range(MEMBERS))
    status = cli("status", workflow_id, env=env)
    assert status.returncode == 0, status.stderr
    assert f"{MEMBERS} of {MEMBERS} done (100%)" in status.stdout
    assert "succeeded" in status.stdout
    assert json.dumps({"sum": sum(i * i for i in range(MEMBERS))}) in status.stdout
