"""The dashboard as a person uses it: headless Chromium (Debian's ``chromium``, driven by Playwright) against
``sqs-worker dashboard`` and ``sqs-worker run`` as processes on a moto server.

Screenshots of each page go to the test's temporary folder, and to ``SQS_WORKER_SCREENSHOTS`` when set (the
README's come from ``SQS_WORKER_SCREENSHOTS=docs/screenshots``).
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.support.backends import Backend
from tests.support.browser import (
    cell,
    chromium,
    running_dashboard,
    shot,
    signed_in_page,
    stack_env,
    stop,
    worker_and_dashboard,
)
from tests.support.harness import make_queues
from tests.support.process import wait_until, worker_env
from tests.support.queues import message_count, queue_counts
from worker.ops.bootstrap import Created
from worker.producer import Job
from worker.workflows import callback_key, group

pytest.importorskip("playwright.sync_api")

TOKEN = "dash-" + uuid.uuid4().hex
WORKFLOW = "nightly-squares-" + uuid.uuid4().hex[:6]


@dataclass
class Stack:
    endpoint_url: str
    queues: Created
    table: str
    url: str
    sqs: Any
    worker: subprocess.Popen[bytes]


@pytest.fixture(scope="module")
def stack(moto_backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    endpoint = moto_backend.endpoint_url
    tmp = tmp_path_factory.mktemp("dashboard")
    queues = make_queues(endpoint, max_receive_count=5)
    table = f"ledger-{uuid.uuid4().hex[:8]}"
    env = stack_env(endpoint, tmp, table=table, WORKER_QUEUE=queues.queue_url.rsplit("/", 1)[-1])
    sqs = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1")
    for card in ("4000-0001", "4000-0002", "4000-0003"):
        sqs.send_message(
            QueueUrl=queues.queue_url, MessageBody=json.dumps({"type": "charge_card", "payload": {"card": card}})
        )
    for _ in range(2):
        sqs.send_message(QueueUrl=queues.queue_url, MessageBody=json.dumps({"type": "resize_image", "payload": {}}))
    invoice = {"type": "sync_invoice", "payload": {"invoice": "INV-7"}}
    sqs.send_message(QueueUrl=queues.queue_url, MessageBody=json.dumps(invoice))
    report = {"type": "build_report", "payload": {"report": "q3-sales", "api_token": "tok-SECRET-123"}}
    sqs.send_message(QueueUrl=queues.queue_url, MessageBody=json.dumps(report))
    dynamodb = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    squares = group([Job("square", {"n": n}) for n in (2, 3)], callback=Job("total"), workflow_id=WORKFLOW)
    squares.start(sqs=sqs, dynamodb=dynamodb, queue=queues.queue_url, table=table)

    def callback_done() -> bool:
        item = dynamodb.get_item(TableName=table, Key={"key": {"S": callback_key(WORKFLOW)}}, ConsistentRead=True)
        return item.get("Item", {}).get("status", {}).get("S") == "COMPLETED"

    with worker_and_dashboard(env, tmp, token=TOKEN) as (worker, url):
        wait_until(
            lambda: message_count(sqs, queues.dlq_url) == 6 and message_count(sqs, queues.queue_url) == 0,
            30,
            "the worker to dead-letter 6 jobs and finish the report",
        )
        wait_until(callback_done, 30, "the group's callback to complete")
        yield Stack(endpoint, queues, table, url, sqs, worker)


@pytest.fixture(scope="module")
def browser(stack: Stack) -> Iterator[Any]:
    with chromium() as browser:
        yield browser


@pytest.fixture
def page(browser: Any, stack: Stack) -> Iterator[Any]:
    with signed_in_page(browser, stack.url, TOKEN) as page:
        yield page


def test_overview_shows_the_queue_counts_and_the_workers_page_the_live_worker(
    page: Any, stack: Stack, tmp_path: Path
) -> None:
    dlq = stack.queues.dlq_url.rsplit("/", 1)[-1]
    queue = stack.queues.queue_url.rsplit("/", 1)[-1]
    page.wait_for_selector("body[data-refreshed]", state="attached")  # the live refresh ran
    counts = queue_counts(stack.sqs, stack.queues.dlq_url)
    assert cell(page, dlq, "visible") == str(counts["ApproximateNumberOfMessages"]) == "6"
    assert cell(page, dlq, "in_flight") == "0"
    assert cell(page, queue, "visible") == "0"
    assert page.locator(".chart canvas").count() == 3  # uPlot, served by the dashboard itself, drew the charts
    assert page.locator(".spark canvas").count() == 2
    page.wait_for_timeout(2500)  # two more samples for the sparklines
    shot(page, "overview", tmp_path)
    page.goto(f"{stack.url}workers")
    page.wait_for_selector("#workers tbody tr td:has-text('/ 10')")
    assert queue in page.locator("#workers").inner_text()
    shot(page, "workers", tmp_path)


def test_search_finds_the_dead_letters_of_an_error(page: Any, stack: Stack, tmp_path: Path) -> None:
    page.goto(f"{stack.url}dead-letters")
    page.fill("#q", "card declined")
    page.click("button:has-text('Search')")
    rows = page.locator("#letters tbody tr")
    assert rows.count() == 3
    assert all("card declined" in rows.nth(i).inner_text() for i in range(3))
    assert page.locator("#groups tbody tr").count() == 1
    assert page.locator("#groups tbody tr td").first.inner_text() == "3"
    page.fill("#q", "resize_image")  # job types are searched too
    page.click("button:has-text('Search')")
    assert page.locator("#letters tbody tr").count() == 2
    page.goto(f"{stack.url}dead-letters")
    shot(page, "dead-letters", tmp_path)
    page.locator("#letters tbody tr a").first.click()
    page.wait_for_selector("#body")
    assert "error_category" in page.content()
    shot(page, "dead-letter", tmp_path)


def test_requeue_moves_exactly_the_selected_dead_letters_and_the_audit_shows_it(
    page: Any, stack: Stack, tmp_path: Path
) -> None:
    stop(stack.worker)  # the requeued jobs would fail again: keep them where the requeue put them
    page.goto(f"{stack.url}dead-letters?q=card+declined")
    rows = page.locator("#letters tbody tr")
    selected = [rows.nth(i).get_attribute("data-id") for i in (0, 2)]
    for message_id in selected:
        page.check(f'#letters input[value="{message_id}"]')
    page.click("#requeue-selected")
    page.wait_for_selector("#confirm")  # nothing moved before the confirmation
    assert message_count(stack.sqs, stack.queues.dlq_url) == 6
    assert message_count(stack.sqs, stack.queues.queue_url) == 0
    page.fill("#reason", "issuer fixed the outage")
    shot(page, "confirm", tmp_path)
    page.click("#confirm-button")
    page.wait_for_selector("#done")
    assert "moved 2 of 2" in page.inner_text("#done")
    assert message_count(stack.sqs, stack.queues.dlq_url) == 4
    assert queue_counts(stack.sqs, stack.queues.queue_url)["ApproximateNumberOfMessages"] == 2
    remaining = [row.get_attribute("data-id") for row in page.locator("#letters tbody tr").all()]
    assert len(remaining) == 4
    assert not set(selected) & set(remaining)
    audit = page.locator("#audit tbody tr").first.inner_text()
    assert "requeue" in audit
    assert "issuer fixed the outage" in audit
    assert "\t2\t" in audit
    assert "token" in audit  # who: the dashboard's token holder
    assert stack.queues.dlq_url.rsplit("/", 1)[-1] + ": moved 2 of 2" in audit  # which DLQ (a table is shared)
    shot(page, "audit", tmp_path)


def test_requeue_by_group_moves_that_group_only(page: Any, stack: Stack) -> None:
    page.goto(f"{stack.url}dead-letters")
    page.locator("#groups tr:has-text('image too large') button").click()
    page.fill("#reason", "resizer memory raised")
    page.click("#confirm-button")
    assert "moved 2 of 2" in page.inner_text("#done")
    assert message_count(stack.sqs, stack.queues.dlq_url) == 2
    assert queue_counts(stack.sqs, stack.queues.queue_url)["ApproximateNumberOfMessages"] == 4
    assert "image too large" not in page.inner_text("#letters")
    assert "resizer memory raised" in page.locator("#audit tbody tr").first.inner_text()


def test_jobs_and_schedules_pages(page: Any, stack: Stack, tmp_path: Path) -> None:
    page.goto(f"{stack.url}jobs?key=build_report:q3-sales")
    record = page.inner_text("#record")
    assert "COMPLETED" in record
    assert "100%" in record
    assert "SECRET" not in page.content()  # the result's api_token is redacted as in the logs
    failed = page.inner_text("#failed")  # the ledger's status index lists it, without a Scan
    assert "sync_invoice:INV-7" in failed
    assert "invoice rejected" in failed
    shot(page, "jobs", tmp_path)
    page.fill("#key", WORKFLOW)  # a workflow id, as `sqs-worker status` takes it
    page.click("form.search button")
    page.wait_for_selector("#workflow")
    shown = page.inner_text("#workflow")
    assert f"{WORKFLOW} (group)" in shown
    assert "succeeded" in shown and "2 of 2 done (100%)" in shown
    assert '"sum": 13' in shown and '"failed": 0' in shown
    assert page.locator("#record").count() == 0
    shot(page, "jobs-workflow", tmp_path)
    page.goto(f"{stack.url}schedules")
    assert page.locator("#schedules tbody tr").count() == 3
    shot(page, "schedules", tmp_path)
    before = message_count(stack.sqs, stack.queues.queue_url)  # the worker was stopped by the requeue test
    page.locator("#schedules tr:has-text('cache-refresh') button").click()
    page.fill("#reason", "warm the cache after the deploy")
    page.click("#confirm-button")
    assert "cache-refresh fired for" in page.inner_text("#done")
    assert message_count(stack.sqs, stack.queues.queue_url) == before + 1


def test_a_wrong_token_gets_401_and_a_post_without_csrf_gets_403(browser: Any, stack: Stack) -> None:
    context = browser.new_context()
    try:
        stranger = context.new_page()
        response = stranger.goto(f"{stack.url}?token=wrong")
        assert response is not None
        assert response.status == 401
        assert stranger.goto(f"{stack.url}dead-letters").status == 401
        request = context.request
        response = request.post(
            f"{stack.url}dead-letters/action",
            headers={"Authorization": f"Bearer {TOKEN}"},
            form={"action": "purge", "confirmed": "yes", "reason": "no csrf"},
        )
        assert response.status == 403
        assert "CSRF" in response.text()
    finally:
        context.close()
    assert message_count(stack.sqs, stack.queues.dlq_url) == 2  # nothing purged


def test_the_dashboard_refuses_to_listen_beyond_loopback_without_a_token(stack: Stack) -> None:
    from tests.support.process import cli

    env = worker_env(stack.endpoint_url, WORKER_QUEUE=stack.queues.queue_url.rsplit("/", 1)[-1])
    result = cli("dashboard", "--host", "0.0.0.0", "--port", "0", env=env, timeout_s=30)
    assert result.returncode == 2
    assert "WORKER_DASHBOARD_TOKEN" in result.stderr
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen("http://127.0.0.1:1/", timeout=1)


def test_without_actions_the_dashboard_is_read_only(stack: Stack, tmp_path: Path) -> None:
    env = worker_env(
        stack.endpoint_url, TMP=str(tmp_path), WORKER_QUEUE=stack.queues.queue_url.rsplit("/", 1)[-1]
    )  # no token (loopback), no WORKER_DASHBOARD_ACTIONS
    with running_dashboard(env, tmp_path / "readonly.log") as url:
        with urllib.request.urlopen(f"{url}dead-letters", timeout=10) as response:
            html = response.read().decode()
        assert "read-only" in html
        match = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
        assert match is not None
        form = urllib.parse.urlencode({"csrf": match.group(1), "action": "purge", "confirmed": "yes", "reason": "x"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}dead-letters/action", data=form.encode(), timeout=10)
        assert refused.value.code == 403
        assert "read-only" in refused.value.read().decode()
        with urllib.request.urlopen(f"{url}healthz", timeout=10) as response:
            assert response.status == 200
    assert message_count(stack.sqs, stack.queues.dlq_url) == 2  # nothing purged


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def test_every_answer_carries_the_frame_and_script_headers(stack: Stack) -> None:
    """The 401, the 303 that turns ?token= into a cookie and the health probe too, not only the pages."""
    opener = urllib.request.build_opener(_NoRedirect)
    answers = {}
    for name, path in [("page", f"?token={TOKEN}&x=1"), ("401", "?token=wrong"), ("healthz", "healthz")]:
        try:
            with opener.open(f"{stack.url}{path}", timeout=10) as response:
                answers[name] = (response.status, response.headers)
        except urllib.error.HTTPError as exc:
            answers[name] = (exc.code, exc.headers)
    assert [status for status, _ in answers.values()] == [303, 401, 200]
    for status, headers in answers.values():
        assert headers["X-Frame-Options"] == "DENY", status
        assert headers["Content-Security-Policy"].startswith("default-src 'self'"), status
        assert headers["Referrer-Policy"] == "no-referrer", status


def test_a_notice_in_a_crafted_link_is_not_shown(page: Any, stack: Stack) -> None:
    """A notice is shown only when this dashboard wrote it (signed): a link's own text is not."""
    crafted = urllib.parse.urlencode({"done": "Requeue failed: call support at +1 555 0100", "sig": "0" * 64})
    page.goto(f"{stack.url}dead-letters?{crafted}")
    page.wait_for_selector("#letters")
    assert page.locator("#done").count() == 0
    assert "call support" not in page.inner_text("body")
    page.goto(f"{stack.url}schedules?done=cache-refresh+fired")
    assert page.locator("#done").count() == 0
