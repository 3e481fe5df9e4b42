"""The dashboard over a queue set (``WORKER_QUEUES=critical:10,bulk:1``), in headless Chromium as a person uses it:
every queue and its own DLQ on the overview, the dead letters of both DLQs each with its queue, a requeue that
sends a letter back to the queue it came from, a purge of one queue's DLQ, "fire now" to the first queue.

``sqs-worker run`` dead-letters the jobs (PermanentError) on a moto server, then stops, so what the dashboard
moves stays where it put it. The overview's screenshot goes to ``SQS_WORKER_SCREENSHOTS`` when set.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.backends import Backend
from tests.support.browser import cell, chromium, shot, signed_in_page, stack_env, stop, worker_and_dashboard
from tests.support.harness import sqs_client
from tests.support.process import wait_until
from tests.support.queues import message_count, queue_counts
from worker.ops.bootstrap import Created, ensure_queues

pytest.importorskip("playwright.sync_api")

TOKEN = "dash-" + uuid.uuid4().hex


@dataclass
class SetStack:
    url: str
    sqs: Any
    critical: Created
    bulk: Created


def _name(url: str) -> str:
    return url.rsplit("/", 1)[-1]


@pytest.fixture(scope="module")
def set_stack(moto_backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SetStack]:
    endpoint = moto_backend.endpoint_url
    tmp = tmp_path_factory.mktemp("dashboard-set")
    suffix = uuid.uuid4().hex[:6]
    sqs = sqs_client(endpoint)
    critical = ensure_queues(sqs, f"critical-{suffix}", max_receive_count=5)
    bulk = ensure_queues(sqs, f"bulk-{suffix}", max_receive_count=5)
    queues = f"{_name(critical.queue_url)}:10,{_name(bulk.queue_url)}:1"
    env = stack_env(endpoint, tmp, table=f"ledger-{suffix}", WORKER_QUEUES=queues)
    for card in ("4000-0001", "4000-0002"):
        body = {"type": "charge_card", "payload": {"card": card}}
        sqs.send_message(QueueUrl=critical.queue_url, MessageBody=json.dumps(body))
    for _ in range(3):
        sqs.send_message(QueueUrl=bulk.queue_url, MessageBody=json.dumps({"type": "resize_image", "payload": {}}))
    with worker_and_dashboard(env, tmp, token=TOKEN) as (worker, url):
        wait_until(
            lambda: message_count(sqs, critical.dlq_url) == 2 and message_count(sqs, bulk.dlq_url) == 3,
            30,
            "the worker to dead-letter 2 critical and 3 bulk jobs",
        )
        stop(worker)  # a requeued job would fail again: keep it where the dashboard puts it
        yield SetStack(url, sqs, critical, bulk)


@pytest.fixture(scope="module")
def set_page(set_stack: SetStack) -> Iterator[Any]:
    with chromium() as browser, signed_in_page(browser, set_stack.url, TOKEN) as page:
        yield page


def test_the_overview_lists_every_queue_of_the_set_and_its_dlq(
    set_page: Any, set_stack: SetStack, tmp_path: Path
) -> None:
    page = set_page
    page.goto(set_stack.url)
    page.wait_for_selector("body[data-refreshed]", state="attached")
    rows = page.locator("#queues tbody tr")
    critical, bulk = set_stack.critical, set_stack.bulk
    expected = [critical.queue_url, critical.dlq_url, bulk.queue_url, bulk.dlq_url]
    assert [rows.nth(i).get_attribute("data-queue") for i in range(rows.count())] == [_name(u) for u in expected]
    assert cell(page, _name(set_stack.critical.dlq_url), "visible") == "2"
    assert cell(page, _name(set_stack.bulk.dlq_url), "visible") == "3"
    assert cell(page, _name(set_stack.critical.queue_url), "visible") == "0"
    assert cell(page, _name(set_stack.bulk.queue_url), "visible") == "0"
    assert page.locator(".spark canvas").count() == 4
    page.wait_for_timeout(2500)  # two more samples for the sparklines
    shot(page, "overview-queue-set", tmp_path)


def test_a_requeued_letter_goes_back_to_its_own_queue_and_purge_names_the_queue(
    set_page: Any, set_stack: SetStack, tmp_path: Path
) -> None:
    page, sqs, critical, bulk = set_page, set_stack.sqs, set_stack.critical, set_stack.bulk
    page.goto(f"{set_stack.url}dead-letters")
    rows = page.locator("#letters tbody tr")
    assert rows.count() == 5
    queues = [rows.nth(i).locator('[data-field="queue"]').inner_text() for i in range(5)]
    assert sorted(queues) == sorted([_name(critical.queue_url)] * 2 + [_name(bulk.queue_url)] * 3)
    chosen = page.locator(f'#letters tbody tr[data-queue="{_name(bulk.queue_url)}"]').first.get_attribute("data-id")
    page.check(f'#letters input[value="{chosen}"]')
    page.screenshot(path=str(tmp_path / "dead-letters.png"), full_page=True)
    page.click("#requeue-selected")
    page.wait_for_selector("#confirm")  # nothing moved before the confirmation
    assert message_count(sqs, bulk.dlq_url) == 3
    assert "the queue it came from" in page.inner_text("body")
    page.screenshot(path=str(tmp_path / "confirm-requeue.png"), full_page=True)
    page.fill("#reason", "resizer fixed")
    page.click("#confirm-button")
    page.wait_for_selector("#done")
    assert "moved 1 of 1" in page.inner_text("#done")
    assert queue_counts(sqs, bulk.queue_url)["ApproximateNumberOfMessages"] == 1
    assert message_count(sqs, bulk.queue_url) == 1
    assert message_count(sqs, bulk.dlq_url) == 2
    assert message_count(sqs, critical.queue_url) == 0
    assert message_count(sqs, critical.dlq_url) == 2
    assert chosen not in [row.get_attribute("data-id") for row in page.locator("#letters tbody tr").all()]
    audit = page.locator("#audit tbody tr").first.inner_text()
    assert "requeue" in audit
    assert "resizer fixed" in audit
    assert "\t1\t" in audit

    page.click(f"button:has-text('Purge {_name(critical.dlq_url)}')")
    page.wait_for_selector("#confirm")
    assert _name(critical.dlq_url) in page.inner_text("h1")
    assert f"of queue {_name(critical.queue_url)}" in page.inner_text("body")
    page.screenshot(path=str(tmp_path / "confirm-purge.png"), full_page=True)
    page.fill("#reason", "test data")
    page.click("#confirm-button")
    page.wait_for_selector("#done")
    assert message_count(sqs, critical.dlq_url) == 0
    assert message_count(sqs, bulk.dlq_url) == 2  # the other queue's DLQ keeps its letters


def test_fire_now_sends_to_the_first_queue(set_page: Any, set_stack: SetStack) -> None:
    page, sqs = set_page, set_stack.sqs
    before = message_count(sqs, set_stack.bulk.queue_url)
    page.goto(f"{set_stack.url}schedules")
    page.locator("#schedules tr:has-text('cache-refresh') button").click()
    assert _name(set_stack.critical.queue_url) in page.inner_text("body")
    page.fill("#reason", "warm the cache")
    page.click("#confirm-button")
    assert "cache-refresh fired for" in page.inner_text("#done")
    assert message_count(sqs, set_stack.critical.queue_url) == 1
    assert message_count(sqs, set_stack.bulk.queue_url) == before


def test_a_purge_without_a_queue_is_refused_when_the_set_has_several(set_page: Any, set_stack: SetStack) -> None:
    page = set_page
    page.goto(f"{set_stack.url}dead-letters")
    csrf = page.locator('#selected input[name="csrf"]').get_attribute("value")
    response = page.context.request.post(
        f"{set_stack.url}dead-letters/action", form={"csrf": csrf, "action": "purge", "confirmed": "yes", "reason": "x"}
    )
    assert response.status == 400
    assert "several queues are configured" in response.text()
    assert message_count(set_stack.sqs, set_stack.bulk.dlq_url) == 2  # nothing purged
