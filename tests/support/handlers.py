"""Handlers for tests that run ``sqs-worker run`` as a real process.

Each job appends a line to the file named by ``TEST_EFFECTS_FILE``, so a test sees what ran, and how often.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from worker import JobContext, job


def record(line: str) -> None:
    path = Path(os.environ["TEST_EFFECTS_FILE"])
    with path.open("a", encoding="utf-8") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


@job("record", max_attempts=3, timeout_s=30)
async def record_job(payload: dict[str, Any], ctx: JobContext) -> None:
    record(f"record {payload.get('n')} attempt={ctx.attempt}")


@job("slow", max_attempts=3, timeout_s=60)
def slow_job(payload: dict[str, Any], ctx: JobContext) -> None:
    record(f"started {payload.get('n')}")
    time.sleep(float(payload.get("seconds", 2)))  # the work itself, in a thread
    record(f"finished {payload.get('n')}")


@job("slow_first", max_attempts=3, timeout_s=60)
def slow_first_job(payload: dict[str, Any], ctx: JobContext) -> None:
    """Slow on its first attempt only, so a rerun after a restart is quick."""
    record(f"started {payload.get('n')} attempt={ctx.attempt}")
    if ctx.attempt == 1:
        time.sleep(float(payload.get("seconds", 2)))  # the work itself, in a thread
    record(f"finished {payload.get('n')}")
