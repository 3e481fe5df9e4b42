"""Handlers for ``sqs-worker run --burst`` as a real process: quick retries (backoff_max_s=1) so bursts are short.

Each run appends a line to ``TEST_EFFECTS_FILE``.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from worker import JobContext, PermanentError, RetryableError, job


def record(line: str) -> None:
    """Not ``tests.support.handlers.record``: importing that module would register its jobs (backoff_max_s 900),
    and the burst's bound is the largest backoff_max_s of the registered jobs."""
    with Path(os.environ["TEST_EFFECTS_FILE"]).open("a", encoding="utf-8") as handle:
        handle.write(line + "\n")


@job("ok", max_attempts=3, backoff_base_s=1, backoff_max_s=1)
async def ok(payload: dict[str, Any], ctx: JobContext) -> None:
    record(f"ok {payload.get('n')}")


@job("flaky", max_attempts=3, backoff_base_s=1, backoff_max_s=1)
def flaky(payload: dict[str, Any], ctx: JobContext) -> None:
    record(f"flaky attempt={ctx.attempt}")
    if ctx.attempt == 1:
        raise RetryableError("not yet", delay_s=2)


@job("refused", max_attempts=3, backoff_base_s=1, backoff_max_s=1)
async def refused(payload: dict[str, Any], ctx: JobContext) -> None:
    record("refused")
    raise PermanentError("the account is closed")


@job("nap", max_attempts=3, backoff_base_s=1, backoff_max_s=1)
async def nap(payload: dict[str, Any], ctx: JobContext) -> None:
    record("nap started")
    await asyncio.sleep(float(payload.get("seconds", 2)))  # the work itself
    record("nap done")


@job("loop", max_attempts=3, backoff_base_s=1, backoff_max_s=1)
async def loop(payload: dict[str, Any]) -> None:
    """Records the module of the event loop it runs on (``WORKER_EVENT_LOOP``)."""
    record(f"loop {type(asyncio.get_running_loop()).__module__}")
