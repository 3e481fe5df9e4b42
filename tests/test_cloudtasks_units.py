"""The Cloud Tasks backend's pure parts (contract, task building, retry-config mapping, key cache, settings) and
the dead-letter store's big bodies on a real DynamoDB endpoint."""

from __future__ import annotations

import asyncio
import re
import shlex
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.support.backends import Backend
from tests.support.cloudtasks import make_dead_letter_table
from tests.support.idempotency import dynamodb_client
from worker.backends.cloudtasks.auth import (
    MIN_REFRESH_INTERVAL_S,
    RETRY_AFTER_FAILURE_S,
    KeySet,
    KeysUnavailable,
    Unauthorized,
)
from worker.backends.cloudtasks.contract import (
    MAX_TASK_BODY_BYTES,
    effective_max_attempts,
    parse_request,
    queue_retry_config,
    retry,
)
from worker.backends.cloudtasks.deadletters import BODY_CHUNK_BYTES, DeadLetterStore, make_record
from worker.backends.cloudtasks.dlq import audit_headers
from worker.backends.cloudtasks.producer import build_task, task_id
from worker.backends.cloudtasks.settings import CloudTasksSettings, load_cloudtasks_settings
from worker.errors import ConfigError
from worker.jobs import Registry
from worker.settings import WorkerSettings

README = Path(__file__).resolve().parents[1] / "README.md"


def test_parse_request_reads_the_cloud_tasks_headers() -> None:
    request = parse_request(
        b"{}",
        {
            "x-cloudtasks-taskname": "abc",
            "x-cloudtasks-queuename": "projects/p/locations/l/queues/jobs",
            "x-cloudtasks-taskretrycount": "4",
            "x-cloudtasks-taskexecutioncount": "3",
        },
        default_queue="q",
    )
    assert (request.task_name, request.queue_name, request.attempt, request.execution_count) == ("abc", "jobs", 5, 3)
    local = parse_request(b"{}", {"x-cloudtasks-taskretrycount": "-1"}, default_queue="q")
    assert local.task_name.startswith("local-") and local.attempt == 1 and local.queue_name == "q"


@pytest.mark.parametrize(("job", "queue", "expected"), [(5, 100, 5), (10, 3, 3), (1, 1, 1)])
def test_the_last_attempt_is_the_smaller_limit(job: int, queue: int, expected: int) -> None:
    assert effective_max_attempts(job_max_attempts=job, queue_max_attempts=queue) == expected


def test_retry_answers() -> None:
    assert (retry("x").status, retry("x").headers()) == (500, {})
    assert (retry("x", delay_s=2.2).status, retry("x", delay_s=2.2).headers()) == (429, {"Retry-After": "3"})
    assert retry("x", delay_s=0).headers() == {"Retry-After": "1"}


def readme_deploy_block() -> str:
    text = README.read_text(encoding="utf-8")
    match = re.search(r"```bash\n(PROJECT=my-project .*?)```", text, flags=re.DOTALL)
    assert match is not None
    return match.group(1).replace("\\\n", " ")


def test_readme_queue_flags_are_the_mapping_of_the_readme_handlers() -> None:
    registry = Registry()  # the README's app/jobs.py
    registry.job("send_email", max_attempts=5, timeout_s=20)(lambda payload: None)
    registry.job("import_rows", timeout_s=600)(lambda payload: None)
    config = queue_retry_config(registry.specs())
    line = next(line for line in readme_deploy_block().splitlines() if line.startswith("gcloud tasks queues create"))
    words = shlex.split(line)
    flags = {word.removeprefix("--"): words[i + 1] for i, word in enumerate(words) if word.startswith("--")}
    for name, value in config.items():
        assert flags[name] == str(value), name
    assert config["max-doublings"] == 9  # 2 s doubled 9 times passes 900 s


def test_readme_deploy_sets_valid_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    block = readme_deploy_block()
    assigned: dict[str, str] = {}
    for group in re.findall(r'--(?:set|update)-env-vars "([^"]+)"', block):
        for pair in group.split(","):
            name, _, value = pair.partition("=")
            assigned[name] = value.replace("$PROJECT", "my-project").replace("$REGION", "europe-west1")
    for name in [name for name in __import__("os").environ if name.startswith("WORKER_")]:
        monkeypatch.delenv(name)
    for name, value in assigned.items():
        monkeypatch.setenv(name, value.replace("$SA", "sa@x.iam.gserviceaccount.com").replace("$URL", "https://u"))
    worker = WorkerSettings(_env_file=None)
    cloudtasks = CloudTasksSettings(_env_file=None)
    assert worker.backend == "cloudtasks" and worker.concurrency == 10
    assert cloudtasks.queue_path(worker.queue) == "projects/my-project/locations/europe-west1/queues/jobs"
    assert cloudtasks.max_attempts == 5 and cloudtasks.dead_letter_table == "jobs-dead-letters"
    prefixed = {name.removeprefix("WORKER_CLOUDTASKS_").lower() for name in assigned if "CLOUDTASKS" in name}
    assert prefixed <= set(CloudTasksSettings.model_fields)


def settings(**overrides: Any) -> CloudTasksSettings:
    values: dict[str, Any] = {"project": "p", "location": "l", "url": "https://w.example/tasks", **overrides}
    return CloudTasksSettings(**values)


def test_build_task_with_oidc_name_delay_and_deadline() -> None:
    ct = settings(service_account="sa@p.iam.gserviceaccount.com", dispatch_deadline_s=900)
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    path = ct.queue_path("jobs")
    task = build_task(ct, path, b"{}", name=task_id("order-1"), delay_s=90, now=now)
    assert task["name"] == f"projects/p/locations/l/queues/jobs/tasks/{task_id('order-1')}"
    assert task["http_request"]["oidc_token"] == {
        "service_account_email": "sa@p.iam.gserviceaccount.com",
        "audience": "https://w.example/tasks",
    }
    assert "X-Worker-Secret" not in task["http_request"]["headers"]
    assert task["schedule_time"].ToDatetime(tzinfo=UTC) == datetime(2026, 11, 30, 12, 1, 30, tzinfo=UTC)
    assert task["dispatch_deadline"].seconds == 900
    with pytest.raises(ConfigError, match="1 MB"):
        build_task(ct, path, b"x" * 1_048_576)
    with pytest.raises(ConfigError, match="30 days"):
        build_task(ct, path, b"{}", delay_s=31 * 24 * 3600)
    local = build_task(settings(shared_secret="s" * 16), path, b"{}")
    assert local["http_request"]["headers"]["X-Worker-Secret"] == "s" * 16
    with pytest.raises(ConfigError, match="SERVICE_ACCOUNT"):
        build_task(settings(), path, b"{}")


def test_a_requeues_audit_headers_fit_beside_a_body_at_the_limit_and_a_huge_reason_is_refused() -> None:
    """A body at the limit still takes its audit; a reason too long for the task's room is refused (the record
    stays) instead of making a task Cloud Tasks would refuse for its size."""
    ct = settings(service_account="sa@p.iam.gserviceaccount.com")
    path = ct.queue_path("jobs")
    at_limit = b"x" * MAX_TASK_BODY_BYTES
    audit = {"requeued_by": "ops", "requeued_at": "2026-12-01T00:00:00.000Z", "requeue_reason": "fixed " * 100}
    build_task(ct, path, at_limit, headers=audit_headers(audit, "t1"))
    huge = audit_headers({**audit, "requeue_reason": "r" * 100_000}, "t1")
    with pytest.raises(ConfigError, match="--reason"):
        build_task(ct, path, at_limit, headers=huge)


def test_task_ids_fit_the_cloud_tasks_alphabet() -> None:
    for key in ("a", "ümlaut/with spaces", "x" * 5000, "schedule:daily:2026-11-30T00:00:00Z"):
        ident = task_id(key)
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,500}", ident)
    assert task_id("a") != task_id("b")


async def test_signing_keys_are_cached_and_refetched_sparingly() -> None:
    from tests.support.cloudtasks import SigningKeys

    keys = SigningKeys()
    try:
        now = [0.0]
        fetches: list[str] = []

        def fetch(url: str) -> dict[str, Any]:
            fetches.append(url)
            return keys.jwks

        key_set = KeySet("https://keys", cache_s=600, fetch=fetch, monotonic=lambda: now[0])
        assert await key_set.key(keys.kid) is not None
        assert await key_set.key(keys.kid) is not None
        with pytest.raises(Unauthorized, match="unknown key id"):
            await key_set.key("forged")
        assert len(fetches) == 1  # within MIN_REFRESH_INTERVAL_S of the first fetch
        now[0] = MIN_REFRESH_INTERVAL_S + 1
        with pytest.raises(Unauthorized):
            await key_set.key("forged")
        with pytest.raises(Unauthorized):
            await key_set.key("forged-again")
        assert len(fetches) == 2
        now[0] = MIN_REFRESH_INTERVAL_S + 1 + 601
        await key_set.key(keys.kid)
        assert len(fetches) == 3  # stale after cache_s
    finally:
        keys.close()


async def test_concurrent_requests_share_one_key_fetch_and_a_failure_pauses_fetching() -> None:
    """Five deliveries waiting for slow keys wait for one fetch together (they queued behind one another, each
    with a fetch of its own: the fifth waited five fetch timeouts); after a failure the next requests are refused
    at once until RETRY_AFTER_FAILURE_S has passed."""
    from tests.support.cloudtasks import SigningKeys

    keys = SigningKeys()
    try:
        now = [0.0]
        release = threading.Event()
        fetches: list[str] = []
        answers: list[Any] = [OSError("timed out")]

        def fetch(url: str) -> dict[str, Any]:
            fetches.append(url)
            release.wait(10)
            answer = answers.pop(0) if answers else keys.jwks
            if isinstance(answer, Exception):
                raise answer
            return answer

        key_set = KeySet("https://keys", cache_s=600, fetch=fetch, monotonic=lambda: now[0])
        waiting = [asyncio.create_task(key_set.key(keys.kid)) for _ in range(5)]
        await asyncio.sleep(0)  # every request is waiting now
        release.set()
        results = await asyncio.gather(*waiting, return_exceptions=True)
        assert all(isinstance(r, KeysUnavailable) and "timed out" in str(r) for r in results), results
        assert len(fetches) == 1
        with pytest.raises(KeysUnavailable, match="timed out"):
            await key_set.key(keys.kid)  # at once: no fetch within RETRY_AFTER_FAILURE_S of the failure
        assert len(fetches) == 1
        now[0] = RETRY_AFTER_FAILURE_S + 1
        assert await key_set.key(keys.kid) is not None
        assert len(fetches) == 2
    finally:
        keys.close()


def test_settings_errors_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER_CLOUDTASKS_SHARED_SECRET", "short")
    with pytest.raises(ConfigError, match="WORKER_CLOUDTASKS_SHARED_SECRET"):
        load_cloudtasks_settings()
    monkeypatch.delenv("WORKER_CLOUDTASKS_SHARED_SECRET")
    with pytest.raises(ConfigError, match="WORKER_CLOUDTASKS_PROJECT"):
        CloudTasksSettings(_env_file=None).queue_path("jobs")


async def test_a_body_larger_than_an_item_is_kept_byte_for_byte(backend: Backend) -> None:
    table = await make_dead_letter_table(backend.endpoint_url)
    body = bytes(range(256)) * (2 * BODY_CHUNK_BYTES // 256 + 7)  # three items' worth, not UTF-8
    async with dynamodb_client(backend.endpoint_url) as client:
        store = DeadLetterStore(client, table, "jobs")
        record = make_record(
            queue="jobs",
            task="t-big",
            body=body,
            category="invalid_message",
            error="body is not UTF-8",
            attempts=1,
            job_type=None,
        )
        await store.put(record)
        [listed] = await store.list(limit=10)
        assert listed.body == body
        assert (await store.get("t-big")) == listed
        assert listed.attributes["error_category"] == "invalid_message"
        await store.delete(listed)
        assert (await client.scan(TableName=table))["Items"] == []


def test_the_listening_socket_lets_asyncio_disable_nagle() -> None:
    """asyncio sets TCP_NODELAY only on accepted sockets whose proto is IPPROTO_TCP; with proto 0 every answer
    waited about 40 ms for a delayed ACK (benchmarks/cloudtasks_serve.py: 220/s and 44 ms before, see README)."""
    import socket

    from worker.backends.cloudtasks.server import bind

    sock = bind("127.0.0.1", 0)
    try:
        assert (sock.family, sock.type, sock.proto) == (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    finally:
        sock.close()


def test_cli_says_what_is_missing_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path, restore_logging: None
) -> None:
    from worker.commands.__main__ import main

    monkeypatch.chdir(tmp_path)
    for name in [name for name in __import__("os").environ if name.startswith("WORKER_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("WORKER_QUEUE", "jobs")
    monkeypatch.setenv("WORKER_BACKEND", "cloudtasks")
    assert main(["run"]) == 2
    assert "run `sqs-worker serve-tasks`" in capsys.readouterr().err
    assert main(["enqueue", "x"]) == 2
    assert "WORKER_CLOUDTASKS_PROJECT and WORKER_CLOUDTASKS_LOCATION must be set" in capsys.readouterr().err
    assert main(["serve-tasks"]) == 2
    assert "never runs unauthenticated requests" in capsys.readouterr().err
    monkeypatch.setenv("WORKER_CLOUDTASKS_SHARED_SECRET", "s" * 16)
    monkeypatch.setenv("WORKER_HANDLERS", "tests.support.handlers")
    assert main(["serve-tasks"]) == 2
    assert "WORKER_CLOUDTASKS_DEAD_LETTER_TABLE is not set" in capsys.readouterr().err


def test_a_task_name_cloud_tasks_knows_already_is_reported_not_raised() -> None:
    """Cloud Tasks answers ALREADY_EXISTS for a second task of a name (the emulator does not: a client that answers
    as Cloud Tasks does stands in for it here)."""
    from google.api_core import exceptions

    from worker.backends.cloudtasks.producer import create_task, job_task
    from worker.producer import Job

    class AnswersAlreadyExists:
        def __init__(self) -> None:
            self.calls: list[dict[str, Any]] = []

        def create_task(self, *, parent: str, task: dict[str, Any]) -> Any:
            self.calls.append(task)
            raise exceptions.AlreadyExists("Requested entity already exists")  # type: ignore[no-untyped-call]

    ct = settings(shared_secret="s" * 16)
    path, task = job_task(ct, "jobs", Job("send_email", {"to": "a@example.com"}, idempotency_key="welcome-a"))
    client = AnswersAlreadyExists()
    created = create_task(client, ct, path, task)
    assert (created.name, created.created) == (f"{path}/tasks/{task_id('welcome-a')}", False)
    assert client.calls == [task]
    with pytest.raises(ConfigError, match="message groups"):
        job_task(ct, "jobs", Job("send_email", group_id="g"))


def test_the_emulator_runs_from_its_own_venv_and_a_missing_one_says_how_to_make_it(tmp_path: Path) -> None:
    """The emulator pins protobuf<5: it runs from .tools/cloudtasks-emulator-venv, never from the project's venv
    (whose google-cloud-tasks and protobuf are the ones users get with the `gcp` extra)."""
    import importlib.util

    from tests.support.cloudtasks import start_emulator

    assert importlib.util.find_spec("gcloud_tasks_emulator") is None, "the emulator leaked into the project's venv"
    missing = r"no Cloud Tasks emulator virtualenv at .*/none: run infra/cloudtasks/setup\.sh"
    with pytest.raises(RuntimeError, match=missing):
        start_emulator(venv=tmp_path / "none")
