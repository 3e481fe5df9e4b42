"""Handlers for the test that runs ``sqs-worker run`` on the queue Terraform created.

Each run appends ``<type> <payload value> key=<idempotency key>`` to ``TEST_EFFECTS_FILE``.
"""

from __future__ import annotations

from typing import Any

from tests.support.handlers import record
from worker import JobContext, job


@job("send_report", idempotent=True, max_attempts=3, timeout_s=30)
async def send_report(payload: dict[str, Any], ctx: JobContext) -> None:
    record(f"send_report {payload.get('report')} key={ctx.idempotency_key}")


@job("barrier", max_attempts=3, timeout_s=30)
async def barrier(payload: dict[str, Any], ctx: JobContext) -> None:
    record(f"barrier {payload.get('n')}")
