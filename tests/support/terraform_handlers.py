"""Handlers for the test that runs ``sqs-worker run`` on the queue Terraform created.

Each run of send_report or barrier appends ``<type> <payload value> key=<idempotency key>`` to
``TEST_EFFECTS_FILE``; refuse always dead-letters (PermanentError).
"""

from __future__ import annotations

from typing import Any

from tests.support.handlers import record
from worker import JobContext, PermanentError, job


@job("send_report", idempotent=True, max_attempts=3, timeout_s=30)
async def send_report(payload: dict[str, Any], ctx: JobContext) -> None:
    record(f"send_report {payload.get('report')} key={ctx.idempotency_key}")


@job("barrier", max_attempts=3, timeout_s=30)
async def barrier(payload: dict[str, Any], ctx: JobContext) -> None:
    record(f"barrier {payload.get('n')}")


@job("refuse", max_attempts=3, timeout_s=30)
async def refuse(payload: dict[str, Any], ctx: JobContext) -> None:
    raise PermanentError(f"refused {payload.get('n')} on purpose")
