"""The browser tests' setup: ``sqs-worker run`` and ``sqs-worker dashboard`` as processes on a moto server,
headless Chromium (Debian's ``chromium``, driven by Playwright) signed in to the dashboard, and screenshots.

Screenshots go to the test's temporary folder, and to ``SQS_WORKER_SCREENSHOTS`` when set (the README's come
from ``SQS_WORKER_SCREENSHOTS=docs/screenshots``). The test modules skip themselves without Playwright
(``pytest.importorskip``); this module imports it only when a browser starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.idempotency import dynamodb_client
from tests.support.process import ROOT, start, wait_until, worker_env
from worker.idempotency import create_table

#: How long one step of a page (a click, a wait for a selector) may take.
STEP_TIMEOUT_MS = 10_000
VIEWPORT_HEIGHT = 860


def chromium_path() -> str:
    found = os.environ.get("SQS_WORKER_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.fail("no chromium on PATH: scripts/test installs it (apt-get install -y chromium)")
    return found


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def dashboard_url(stderr: Path) -> str | None:
    """The URL ``sqs-worker dashboard`` says it listens on (None until it does)."""
    match = re.search(r"sqs-worker dashboard: (http://\S+)", stderr.read_text(encoding="utf-8", errors="replace"))
    return match.group(1) if match else None


def stack_env(endpoint_url: str, folder: Path, *, table: str, **settings: str) -> dict[str, str]:
    """The environment of a worker and dashboard with the dashboard tests' handlers, a new ledger ``table`` (the
    handlers' keyed jobs and the audit trail), the example schedule file and text logs; ``settings`` name the
    queue(s)."""

    async def make_table() -> None:
        async with dynamodb_client(endpoint_url) as client:
            await create_table(client, table)

    asyncio.run(make_table())
    return worker_env(
        endpoint_url,
        TMP=str(folder),
        **settings,
        WORKER_HANDLERS="tests.support.dashboard_handlers",
        WORKER_IDEMPOTENCY_TABLE=table,
        WORKER_SCHEDULES_FILE=str(ROOT / "schedules.example.yaml"),
        WORKER_LOG_FORMAT="text",
    )


@contextlib.contextmanager
def running_dashboard(env: dict[str, str], log: Path) -> Iterator[str]:
    """``sqs-worker dashboard --port 0`` with ``env`` (its stderr in ``log``): its URL once it listens. Stopped on
    exit."""
    process = start("dashboard", "--port", "0", env=env, stderr_path=log)
    try:
        wait_until(lambda: dashboard_url(log) is not None, 30, "the dashboard to listen")
        url = dashboard_url(log)
        assert url is not None
        yield url
    finally:
        stop(process)


@contextlib.contextmanager
def worker_and_dashboard(
    env: dict[str, str], folder: Path, *, token: str
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``sqs-worker run`` and ``sqs-worker dashboard`` (actions on, ``token``, a sample a second) with ``env``,
    their stderr in ``folder``: the worker's process and the dashboard's URL. Both stop on exit, and neither log
    may then hold a traceback."""
    worker = start("run", env=env, stderr_path=folder / "worker.log")
    dash_env = {**env, "WORKER_DASHBOARD_TOKEN": token, "WORKER_DASHBOARD_ACTIONS": "true",
                "WORKER_DASHBOARD_SAMPLE_S": "1"}  # fmt: skip
    try:
        with running_dashboard(dash_env, folder / "dashboard.log") as url:
            yield worker, url
    finally:
        stop(worker)
    for log in ("worker.log", "dashboard.log"):
        text = (folder / log).read_text(encoding="utf-8", errors="replace")
        assert "Traceback" not in text, f"{log}:\n{text[-3000:]}"


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """Headless Chromium, closed on exit."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"], timeout=30_000)
        try:
            yield browser
        finally:
            browser.close()


@contextlib.contextmanager
def signed_in_page(browser: Any, url: str, token: str, *, path: str = "", width: int = 1280) -> Iterator[Any]:
    """A page of a new browser context at ``url + path``, signed in by ``?token=`` (it sets the cookie, as a person
    pastes the link once). The context closes on exit."""
    context = browser.new_context(viewport={"width": width, "height": VIEWPORT_HEIGHT})
    try:
        page = context.new_page()
        page.set_default_timeout(STEP_TIMEOUT_MS)
        page.goto(f"{url}{path}?token={token}")
        yield page
    finally:
        context.close()


def shot(page: Any, name: str, folder: Path) -> None:
    """A full-page screenshot ``name.png`` in ``folder``, copied to ``SQS_WORKER_SCREENSHOTS`` when set."""
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    target = os.environ.get("SQS_WORKER_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(target) / path.name)


def cell(page: Any, queue: str, field: str) -> str:
    """One field of a queue's row on the overview."""
    text: str = page.locator(f'tr[data-queue="{queue}"] [data-field="{field}"]').inner_text()
    return text
