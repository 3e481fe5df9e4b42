"""``sqs-worker`` as a real process, as a user runs it: plain boto3 producers, SIGTERM, bad settings, CLI."""

from __future__ import annotations

import json
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.support.backends import Backend
from tests.support.harness import drain, sqs_client
from tests.support.process import cli, lines, start, wait_until, worker_env
from tests.support.queues import assert_queue_empty


def bootstrapped(backend: Backend, tmp_path: Path, **settings: str) -> tuple[dict[str, str], str]:
    queue = f"proc-{uuid.uuid4().hex[:8]}"
    env = worker_env(
        backend.endpoint_url,
        WORKER_QUEUE=queue,
        WORKER_HANDLERS="tests.support.handlers",
        TEST_EFFECTS_FILE=str(tmp_path / "effects.txt"),
        TMP=str(tmp_path),
        **settings,
    )
    result = cli("bootstrap", env=env)
    assert result.returncode == 0, result.stderr
    assert "maxReceiveCount 5" in result.stdout  # the handlers' max_attempts (3) + 2
    again = cli("bootstrap", env=env)  # safe to repeat
    assert again.returncode == 0, again.stderr
    url = sqs_client(backend.endpoint_url).get_queue_url(QueueName=queue)["QueueUrl"]
    return env, url


def test_plain_boto3_job_is_processed_by_run(backend: Backend, tmp_path: Path) -> None:
    env, url = bootstrapped(backend, tmp_path)
    client = sqs_client(backend.endpoint_url)
    client.send_message(QueueUrl=url, MessageBody=json.dumps({"type": "record", "payload": {"n": 7}}))
    client.send_message(QueueUrl=url, MessageBody="this is not json")
    worker = start("run", env=env, stderr_path=tmp_path / "worker.log")
    try:
        effects = tmp_path / "effects.txt"
        wait_until(lambda: "record 7 attempt=1" in lines(effects), 30, "the job's effect")
        dead = drain(backend.endpoint_url, url + "-dlq", expect=1, timeout_s=20)
        assert [m["MessageAttributes"]["error_category"]["StringValue"] for m in dead] == ["invalid_message"]
        assert dead[0]["Body"] == "this is not json"
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, (tmp_path / "worker.log").read_text()
    log_lines = [
        json.loads(line) for line in (tmp_path / "worker.log").read_text().splitlines() if line.startswith("{")
    ]
    assert any(entry.get("event") == "succeeded" for entry in log_lines)
    assert_queue_empty(sqs_client(backend.endpoint_url), url)  # the job acknowledged, the bad one dead-lettered


def test_sigterm_mid_job_finishes_the_job_and_exits_0(backend: Backend, tmp_path: Path) -> None:
    env, url = bootstrapped(backend, tmp_path, WORKER_SHUTDOWN_GRACE_S="20")
    sqs_client(backend.endpoint_url).send_message(
        QueueUrl=url, MessageBody=json.dumps({"type": "slow", "payload": {"n": 1, "seconds": 3}})
    )
    effects = tmp_path / "effects.txt"
    worker = start("run", env=env, stderr_path=tmp_path / "worker.log")
    try:
        wait_until(lambda: "started 1" in lines(effects), 30, "the job to start")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, (tmp_path / "worker.log").read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
    assert lines(effects) == ["started 1", "finished 1"]
    # Finished and acknowledged: deleted, not merely invisible.
    assert_queue_empty(sqs_client(backend.endpoint_url), url)


def test_second_signal_exits_at_once(backend: Backend, tmp_path: Path) -> None:
    env, url = bootstrapped(backend, tmp_path, WORKER_SHUTDOWN_GRACE_S="60")
    sqs_client(backend.endpoint_url).send_message(
        QueueUrl=url, MessageBody=json.dumps({"type": "slow", "payload": {"n": 2, "seconds": 30}})
    )
    effects = tmp_path / "effects.txt"
    worker = start("run", env=env, stderr_path=tmp_path / "worker.log")
    try:
        wait_until(lambda: "started 2" in lines(effects), 30, "the job to start")
        worker.send_signal(signal.SIGTERM)
        wait_until(lambda: "shutting down" in (tmp_path / "worker.log").read_text(), 10, "the first signal")
        worker.send_signal(signal.SIGINT)
        assert worker.wait(timeout=10) != 0
    finally:
        if worker.poll() is None:
            worker.kill()
    assert "finished 2" not in lines(effects)


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({}, "WORKER_QUEUE is not set"),
        ({"WORKER_QUEUE": "q", "WORKER_CONCURRENCY": "lots"}, "WORKER_CONCURRENCY"),
        ({"WORKER_QUEUE": "q", "WORKER_HANDLERS": "no.such.module"}, "WORKER_HANDLERS: no module 'no.such.module'"),
        ({"WORKER_QUEUE": "q"}, "no job handlers registered"),
        (
            {"WORKER_QUEUE": "q", "WORKER_HANDLERS": "tests.support.idempotent_handlers"},
            "are idempotent but WORKER_IDEMPOTENCY_TABLE is not set",
        ),
    ],
)
def test_bad_settings_stop_the_start_with_one_line(settings: dict[str, str], expected: str, tmp_path: Path) -> None:
    env = worker_env("http://127.0.0.1:9", TMP=str(tmp_path), **settings)
    result = cli("run", env=env, timeout_s=30)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(error_lines) == 1 and expected in error_lines[0], result.stderr


def test_missing_queue_is_a_clear_error(backend: Backend, tmp_path: Path) -> None:
    env = worker_env(
        backend.endpoint_url, WORKER_QUEUE="does-not-exist", WORKER_HANDLERS="tests.support.handlers", TMP=str(tmp_path)
    )
    result = cli("run", env=env, timeout_s=30)
    assert result.returncode == 2
    assert "does not exist" in result.stderr and "sqs-worker bootstrap" in result.stderr
    assert "Traceback" not in result.stderr


def test_enqueue_command_sends_the_envelope(backend: Backend, tmp_path: Path) -> None:
    env, url = bootstrapped(backend, tmp_path)
    result = cli("enqueue", "record", "--payload", '{"n": 3}', "--idempotency-key", "k-3", env=env)
    assert result.returncode == 0, result.stderr
    message = drain(backend.endpoint_url, url, expect=1)[0]
    assert message["MessageId"] == result.stdout.strip()
    assert json.loads(message["Body"]) == {"type": "record", "payload": {"n": 3}, "idempotency_key": "k-3"}
    bad = cli("enqueue", "record", "--payload", "[1]", env=env)
    assert bad.returncode == 2 and "JSON object" in bad.stderr


def test_every_command_has_help() -> None:
    env = worker_env("http://127.0.0.1:9")
    top = cli("--help", env=env)
    assert top.returncode == 0
    for command in ("run", "bootstrap", "enqueue", "dev", "schema"):
        assert command in top.stdout
        result = cli(command, "--help", env=env)
        assert result.returncode == 0 and "usage: sqs-worker" in result.stdout, command


def test_schema_prints_the_envelope_schema() -> None:
    result = cli("schema", env=worker_env("http://127.0.0.1:9"))
    schema = json.loads(result.stdout)
    assert schema["required"] == ["type"]
    assert set(schema["properties"]) == {"type", "payload", "idempotency_key", "workflow"}  # workflow: README
    assert schema["additionalProperties"] is False


def test_dev_processes_demo_jobs(tmp_path: Path) -> None:
    """`sqs-worker dev`: embedded local AWS, demo jobs processed, clean exit on SIGTERM."""
    # Endpoints of the environment do not matter: dev hands its own to the clients (never via os.environ).
    env = worker_env("http://127.0.0.1:9", TMP=str(tmp_path), AWS_ENDPOINT_URL_SQS="http://127.0.0.1:9")
    log_path = tmp_path / "dev.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([*cli_prefix(), "dev"], env=env, stdout=subprocess.DEVNULL, stderr=log, cwd=tmp_path)
    try:
        wait_until(lambda: log_path.read_text().count("job succeeded") >= 3, 60, "demo jobs to succeed")
        # the demo's bad payload (the demo sends more jobs now: its dead letter may come after three successes)
        wait_until(lambda: "job dead-lettered" in log_path.read_text(), 60, "the demo's bad payload dead-lettered")
        assert "sqs-worker dev: local AWS at http://127.0.0.1:" in log_path.read_text()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()


def cli_prefix() -> list[str]:
    import sys

    return [sys.executable, "-m", "worker.commands"]


def test_health_and_prometheus_endpoints_of_a_running_worker(backend: Backend, tmp_path: Path) -> None:
    import urllib.request

    from worker.dev.localaws import free_port

    port = free_port()
    env, url = bootstrapped(backend, tmp_path, WORKER_HEALTH_PORT=str(port), WORKER_PROMETHEUS_PORT=str(port))
    sqs_client(backend.endpoint_url).send_message(
        QueueUrl=url, MessageBody=json.dumps({"type": "record", "payload": {"n": 1}})
    )
    worker = start("run", env=env, stderr_path=tmp_path / "worker.log")

    def get(path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
                return response.status, response.read().decode()
        except OSError:
            return 0, ""

    try:
        wait_until(lambda: 'outcome="succeeded"' in get("/metrics")[1], 30, "the job in the scrape")
        assert 'sqs_worker_endpoint_up{service="sqs"} 1.0' in get("/metrics")[1]  # a sample before any failure
        assert get("/healthz")[0] == 200
        assert get("/readyz")[0] == 200
        health = cli("health", "--check", env=env)
        assert health.returncode == 0, health.stdout + health.stderr
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
    stale = cli("health", "--check", env=env)
    assert stale.returncode != 0  # the liveness file went with the worker


def test_missing_idempotency_table_is_a_clear_error(backend: Backend, tmp_path: Path) -> None:
    env, _ = bootstrapped(backend, tmp_path)
    env.update(WORKER_IDEMPOTENCY_TABLE="no-such-table", WORKER_HANDLERS="tests.support.idempotent_handlers")
    result = cli("run", env=env, timeout_s=60)
    assert result.returncode == 2, result.stderr
    assert "idempotency table 'no-such-table' does not exist" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_input_errors_are_one_line(backend: Backend, tmp_path: Path) -> None:
    env, _ = bootstrapped(backend, tmp_path)
    for args, expected in [
        (("enqueue", ""), "type: String should have at least 1 character"),
        (("enqueue", "record", "--idempotency-key", ""), "idempotency_key: String should have at least 1 character"),
        (("bootstrap", "--max-receive-count", "0"), "must be between 1 and 1000"),
    ]:
        result = cli(*args, env=env)
        assert result.returncode == 2, result.stderr
        assert expected in result.stderr
        assert "Traceback" not in result.stderr
    warned = cli("bootstrap", "--max-receive-count", "2", env=env)
    assert warned.returncode == 0
    assert "not above the largest max_attempts (3)" in warned.stderr


@pytest.mark.parametrize("setting", ["WORKER_HEALTH_PORT", "WORKER_PROMETHEUS_PORT"])
def test_a_taken_port_stops_the_start_before_the_queue_is_touched(
    backend: Backend, tmp_path: Path, setting: str
) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))  # the worker's address: all interfaces
        taken.listen()
        port = taken.getsockname()[1]
        env, url = bootstrapped(backend, tmp_path, **{setting: str(port)})
        client = sqs_client(backend.endpoint_url)
        client.send_message(QueueUrl=url, MessageBody=json.dumps({"type": "record", "payload": {"n": 1}}))
        worker = start("run", env=env, stderr_path=tmp_path / "worker.log")
        try:
            code = worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(timeout=10)
            pytest.fail(f"the worker ran with {setting} taken:\n" + (tmp_path / "worker.log").read_text()[-3000:])
    stderr = (tmp_path / "worker.log").read_text().splitlines()
    assert code == 2, stderr
    assert stderr == [f"sqs-worker: error: {setting}={port}: cannot listen on port {port}: Address already in use"]
    attributes = client.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=[
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ],
    )["Attributes"]
    assert (
        int(attributes["ApproximateNumberOfMessages"]),
        int(attributes["ApproximateNumberOfMessagesNotVisible"]),
        int(attributes["ApproximateNumberOfMessagesDelayed"]),
    ) == (1, 0, 0), "the worker received before it failed"
    assert lines(tmp_path / "effects.txt") == []
