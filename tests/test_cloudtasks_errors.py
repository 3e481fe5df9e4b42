"""serve-tasks names the setting at fault: a missing dead-letter table is WORKER_CLOUDTASKS_DEAD_LETTER_TABLE's, at
start and at run time (not the idempotency table's), on a real DynamoDB endpoint; and it warns at start about jobs
whose timeout_s reaches the dispatch deadline (none with the defaults or the README's handlers)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.support.backends import Backend
from tests.support.cloudtasks import serving
from tests.support.idempotency import dynamodb_client
from worker.backends.cloudtasks.contract import deadline_warnings, flow_warnings
from worker.backends.cloudtasks.deadletters import DeadLetterStore, make_record
from worker.backends.cloudtasks.settings import CloudTasksSettings
from worker.errors import ConfigError
from worker.flow import Breaker
from worker.jobs import Registry

MISSING = (
    r"dead-letter table 'no-such-dead-letters' does not exist: run `sqs-worker bootstrap` or fix "
    r"WORKER_CLOUDTASKS_DEAD_LETTER_TABLE$"
)


def registry() -> Registry:
    jobs = Registry()
    jobs.job("ok")(lambda payload: None)
    return jobs


@pytest.fixture
def env(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> Backend:
    monkeypatch.setenv("AWS_ENDPOINT_URL", backend.endpoint_url)
    return backend


async def test_a_missing_dead_letter_table_is_named_with_its_setting_at_start(env: Backend, tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match=MISSING) as caught:
        async with serving(registry(), queue="q", dead_letter_table="no-such-dead-letters", tmp_path=tmp_path):
            pass
    assert "WORKER_IDEMPOTENCY_TABLE" not in str(caught.value)


async def test_a_missing_dead_letter_table_is_named_with_its_setting_at_run_time(env: Backend) -> None:
    record = make_record(queue="q", task="t1", body=b"{}", category="permanent", error="no", attempts=1, job_type="x")
    async with dynamodb_client(env.endpoint_url) as client:
        store = DeadLetterStore(client, "no-such-dead-letters", "q")
        with pytest.raises(ConfigError, match="PutItem: " + MISSING):
            await store.put_within(record, give_up_after_s=1.0)
        with pytest.raises(ConfigError, match="Query: " + MISSING):
            await store.list(limit=10)


def readme_registry() -> Registry:
    jobs = Registry()  # the README's app/jobs.py, and a job with the default timeout_s (900)
    jobs.job("send_email", max_attempts=5, timeout_s=20)(lambda payload: None)
    jobs.job("import_rows", timeout_s=600)(lambda payload: None)
    jobs.job("plain")(lambda payload: None)
    return jobs


def test_the_defaults_and_the_readme_handlers_draw_no_deadline_warning() -> None:
    assert deadline_warnings(readme_registry().specs(), CloudTasksSettings().dispatch_deadline_s) == []
    [reached] = deadline_warnings(readme_registry().specs(), 600)
    assert "import_rows (timeout_s 600), plain (timeout_s 900)" in reached
    assert "WORKER_CLOUDTASKS_DISPATCH_DEADLINE_S=600" in reached and "send_email" not in reached
    jobs = Registry()
    jobs.job("endless", timeout_s=2000)(lambda payload: None)
    [over] = deadline_warnings(jobs.specs(), 1800)
    assert "endless (timeout_s 2000) have timeout_s above Cloud Tasks' 1800 s" in over


def flow_registry() -> Registry:
    jobs = Registry()
    jobs.job("plain")(lambda payload: None)
    jobs.job("limited", rate_limit="10/s")(lambda payload: None)
    jobs.job("guarded", breaker=Breaker(failures=3, window_s=60, cooldown_s=30))(lambda payload: None)
    jobs.job("both", rate_limit="1/m", breaker=Breaker())(lambda payload: None)
    return jobs


def test_jobs_with_a_rate_limit_or_breaker_draw_one_warning_naming_them() -> None:
    assert flow_warnings(readme_registry().specs()) == []
    [warning] = flow_warnings(flow_registry().specs())
    assert warning.startswith(
        "job(s) both (rate_limit and breaker), guarded (breaker), limited (rate_limit): serve-tasks does not apply"
    ), warning
    assert "plain" not in warning and "--max-dispatches-per-second" in warning


async def test_serve_tasks_warns_at_start_about_the_limits_it_does_not_apply(
    env: Backend, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.support.cloudtasks import make_dead_letter_table

    table = await make_dead_letter_table(env.endpoint_url)
    with caplog.at_level(logging.WARNING, logger="worker"):
        async with serving(flow_registry(), queue="q", dead_letter_table=table, tmp_path=tmp_path):
            pass
    warned = [r.getMessage() for r in caplog.records if "does not apply rate_limit" in r.getMessage()]
    assert warned == flow_warnings(flow_registry().specs())


async def test_serve_tasks_warns_at_start_when_a_timeout_reaches_the_deadline(
    env: Backend, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.support.cloudtasks import make_dead_letter_table

    table = await make_dead_letter_table(env.endpoint_url)
    with caplog.at_level(logging.WARNING, logger="worker"):
        async with serving(
            readme_registry(), queue="q", dead_letter_table=table, tmp_path=tmp_path, dispatch_deadline_s=20
        ):
            pass
    warned = [r.getMessage() for r in caplog.records if "DISPATCH_DEADLINE_S" in r.getMessage()]
    assert warned == [
        "job(s) import_rows (timeout_s 600), plain (timeout_s 900), send_email (timeout_s 20) have timeout_s at or "
        "above WORKER_CLOUDTASKS_DISPATCH_DEADLINE_S=20: Cloud Tasks stops waiting after 20 s and retries while they "
        "still run; set it above the largest timeout_s (at most 1800)"
    ]
