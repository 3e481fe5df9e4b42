"""serve-tasks names the setting at fault: a missing dead-letter table is WORKER_CLOUDTASKS_DEAD_LETTER_TABLE's, at
start and at run time (not the idempotency table's), on a real DynamoDB endpoint."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.backends import Backend
from tests.support.cloudtasks import serving
from tests.support.idempotency import dynamodb_client
from worker.backends.cloudtasks.deadletters import DeadLetterStore, make_record
from worker.errors import ConfigError
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
