"""Handlers with a lifespan, for tests that run ``sqs-worker run`` as a real process.

The lifespan opens a resource at start and closes it at shutdown, each step a line of ``TEST_EFFECTS_FILE``;
with ``TEST_LIFESPAN_FAIL`` set it raises at start instead.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from typing import Any

from tests.support.handlers import record
from worker import JobContext, job, lifespan


class Counter:
    """Stands in for a connection pool: opened once per process, used by every job."""

    def __init__(self) -> None:
        self.uses = 0
        self.closed = False


@lifespan
async def counter() -> AsyncIterator[dict[str, Any]]:
    if os.environ.get("TEST_LIFESPAN_FAIL"):
        raise ConnectionRefusedError("database at 127.0.0.1:9 refused the connection")
    resource = Counter()
    record("startup")
    yield {"counter": resource}
    resource.closed = True
    record(f"shutdown uses={resource.uses}")


@job("use_counter", max_attempts=3, timeout_s=60)
def use_counter(payload: dict[str, Any], ctx: JobContext) -> None:
    resource = ctx.resources.get_as("counter", Counter)
    record(f"started {payload.get('n')}")
    time.sleep(float(payload.get("seconds", 0)))  # the work itself, in a thread
    resource.uses += 1
    record(f"finished {payload.get('n')} closed={resource.closed}")
