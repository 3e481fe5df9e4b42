"""Hostile values on the dashboard, in headless Chromium: a 256-character job type and an error or reason with
U+202E (RIGHT-TO-LEFT OVERRIDE) neither widen the page past the viewport nor reorder what is shown ("evil" stays
"evil"); each such value sits in an isolated ``<bdi>``. Screenshots go to the test's folder (and
``SQS_WORKER_SCREENSHOTS``)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.backends import Backend
from tests.support.browser import chromium, running_dashboard, shot, signed_in_page
from tests.support.harness import make_queues
from tests.support.process import worker_env
from tests.test_dlq import dead_letter

pytest.importorskip("playwright.sync_api")

TOKEN = "dash-" + uuid.uuid4().hex
LONG_TYPE = "t" * 256
RLO = "\u202e"
ZWSP = "\u200b"
WIDTH = 1280


#: Nesting of a body that Python's JSON parser refuses (RecursionError).
DEEPEST_LEVELS = 5_000


@pytest.fixture
def dashboard(moto_backend: Backend, tmp_path: Path) -> Iterator[str]:
    queues = make_queues(moto_backend.endpoint_url)
    dead_letter(
        moto_backend.endpoint_url,
        queues.dlq_url,
        json.dumps({"type": LONG_TYPE, "payload": {"note": f"{RLO}evil", "hidden": f"zero{ZWSP}width"}}),
        category="permanent",
        error=f"refused: {RLO}evil{RLO} zero{ZWSP}width " + "x" * 300,
    )
    deep: Any = "MARKER-AT-DEPTH-14"
    for _ in range(12):
        deep = {"d": deep}
    dead_letter(
        moto_backend.endpoint_url,
        queues.dlq_url,
        json.dumps({"type": "deep", "payload": deep}),
        category="permanent",
        error="PermanentError: card declined",
    )
    dead_letter(  # deeper than Python's parser goes: the worker dead-letters it as invalid_message
        moto_backend.endpoint_url,
        queues.dlq_url,
        '{"type": "deepest", "payload": {"password": "s3cret-value-xyz", "d": '
        + "[" * DEEPEST_LEVELS
        + '"MARKER-DEEPEST"'
        + "]" * DEEPEST_LEVELS
        + "}}",
        category="invalid_message",
        error="body nests deeper than 100 levels",
    )
    env = worker_env(
        moto_backend.endpoint_url,
        TMP=str(tmp_path),
        WORKER_QUEUE=queues.queue_url.rsplit("/", 1)[-1],
        WORKER_DASHBOARD_TOKEN=TOKEN,
        WORKER_DASHBOARD_ACTIONS="true",
    )
    with running_dashboard(env, tmp_path / "dashboard.log") as url:
        yield url


def page_width(page: Any) -> int:
    width: int = page.evaluate("document.documentElement.scrollWidth")
    return width


def isolated(page: Any, selector: str) -> list[tuple[str, str, str]]:
    """(tag, unicode-bidi, text) of each element under ``selector`` whose text holds 'evil'."""
    found: list[tuple[str, str, str]] = page.eval_on_selector_all(
        f"{selector} bdi",
        "els => els.filter(e => e.innerText.includes('evil'))"
        ".map(e => [e.tagName, getComputedStyle(e).unicodeBidi, e.innerText])",
    )
    return found


def test_long_and_bidi_values_stay_in_the_viewport_and_isolated(dashboard: str, tmp_path: Path) -> None:
    with chromium() as browser, signed_in_page(browser, dashboard, TOKEN, path="dead-letters", width=WIDTH) as page:
        assert page_width(page) <= WIDTH
        texts = isolated(page, "#letters")
        assert texts and all(bidi == "isolate" for _, bidi, _ in texts), texts
        assert all("\\u202eevil" in text for _, _, text in texts), texts  # the override shown, not obeyed
        letters = page.inner_text("#letters")
        assert "zero\\u200bwidth" in letters and ZWSP not in letters  # an invisible character shown
        clipped = page.locator("#letters td[data-field=job_type] bdi.clip").first
        assert clipped.get_attribute("title") == LONG_TYPE  # the whole value on hover
        shot(page, "dead-letters-hostile", tmp_path)
        page.locator("#letters tbody tr a").first.click()
        page.wait_for_selector("#body")
        assert page_width(page) <= WIDTH
        body = isolated(page, "#body")
        assert body and all(b == "isolate" and "\\u202eevil" in t for _, b, t in body), body
        assert "\\x0a" not in page.inner_text("#body")  # the body's lines stay lines
        assert "zero\\u200bwidth" in page.inner_text("#body")
        shot(page, "dead-letter-hostile", tmp_path)
        page.goto(f"{dashboard}dead-letters")

        page.locator("#letters input[type=checkbox]").first.check()
        page.click("#requeue-selected")
        page.fill("#reason", f"{RLO}evil reason")
        page.click("#confirm-button")
        page.wait_for_selector("#done")
        why = isolated(page, "#audit")
        assert why and all(b == "isolate" and "\\u202eevil reason" in t for _, b, t in why), why
        assert page_width(page) <= WIDTH
        shot(page, "audit-hostile", tmp_path)


def test_a_deep_body_is_shown_whole_and_a_narrow_window_scrolls_tables_not_errors(
    dashboard: str, tmp_path: Path
) -> None:
    """A valid body 14 levels deep showed "..." below level 8 (the log redactor's cap); at 768 px a long job type
    squeezed the error column to a few characters per line and pushed the table off the page."""
    with chromium() as browser, signed_in_page(browser, dashboard, TOKEN, path="dead-letters", width=768) as page:
        assert page_width(page) <= 768  # the tables scroll in their own box
        widths = page.eval_on_selector_all("#groups td.err", "els => els.map(e => e.getBoundingClientRect().width)")
        font_px = page.evaluate("parseFloat(getComputedStyle(document.querySelector('#groups td.err')).fontSize)")
        assert widths and min(widths) >= 20 * font_px * 0.5, (widths, font_px)  # at least about 22 characters
        shot(page, "dead-letters-narrow", tmp_path)
        page.locator("#letters tbody tr", has_text="deep").locator("a").first.click()
        page.wait_for_selector("#body")
        assert "MARKER-AT-DEPTH-14" in page.inner_text("#body")
        shot(page, "dead-letter-deep", tmp_path)
        page.go_back()
        page.locator("#letters tbody tr", has_text="nests deeper").locator("a").first.click()
        page.wait_for_selector("#body")  # it answered 500 (RecursionError) before
        body = page.inner_text("#body")
        assert "MARKER-DEEPEST" in body and "[" * DEEPEST_LEVELS + '"MARKER' in body, body[:200]
        assert "s3cret-value-xyz" not in body  # redacted as log text is
        shot(page, "dead-letter-deepest", tmp_path)
