"""Example handlers, used by ``sqs-worker dev``. Copy one to start your own."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from pydantic import BaseModel, Field

from worker import JobContext, PermanentError, RetryableError, job


class Email(BaseModel):
    to: str = Field(pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
    subject: str
    body: str = ""


@job("send_email", max_attempts=5, timeout_s=20)
async def send_email(payload: Email, ctx: JobContext) -> dict[str, Any]:
    """Pretend to send an email; the payload is validated into ``Email``."""
    await asyncio.sleep(0.05)  # stands in for the mail API call
    ctx.logger.info("sent email", extra={"subject_length": len(payload.subject)})
    return {"delivered": True}


@job("flaky_webhook", max_attempts=4, timeout_s=10, backoff_base_s=2, backoff_max_s=30)
async def flaky_webhook(payload: dict[str, Any], ctx: JobContext) -> None:
    """Fails its first attempts to show retries with growing delays, then succeeds."""
    succeed_on = int(payload.get("succeed_on_attempt", 2))
    if ctx.attempt < succeed_on:
        raise RetryableError(f"endpoint answered 503 (attempt {ctx.attempt})")
    ctx.logger.info("webhook delivered")


@job("import_rows", max_attempts=3, timeout_s=60)
def import_rows(payload: dict[str, Any], ctx: JobContext) -> int:
    """A plain ``def`` handler: runs in a thread; reports progress."""
    rows = int(payload.get("rows", 100))
    for done in range(0, rows + 1, max(1, rows // 4)):
        ctx.progress(100 * done / max(rows, 1), f"{done} of {rows} rows")
    return rows


@job("charge_card", idempotent=True, max_attempts=3)
async def charge_card(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Idempotent: the same payload (or idempotency_key) charges once, however often it is delivered."""
    if payload.get("amount_cents", 0) <= 0:
        raise PermanentError("amount_cents must be positive")
    return {"charge_id": f"ch_{random.randrange(10**8):08d}", "key": ctx.idempotency_key}


# The job types of schedules.example.yaml, fired by EventBridge Scheduler in AWS and by `sqs-worker dev` locally.
# A scheduled job's idempotency key is "schedule:<name>:<scheduled time>", so a double fire runs once.


@job("send_report", max_attempts=3, timeout_s=120)
async def send_report(payload: dict[str, Any], ctx: JobContext) -> None:
    ctx.logger.info("report built", extra={"report": payload.get("report"), "key": ctx.idempotency_key})


@job("close_month", max_attempts=3, timeout_s=300)
async def close_month(payload: dict[str, Any], ctx: JobContext) -> None:
    ctx.logger.info("month closed", extra={"key": ctx.idempotency_key})


@job("refresh_cache", max_attempts=2, timeout_s=60)
async def refresh_cache(payload: dict[str, Any], ctx: JobContext) -> None:
    ctx.logger.info("cache refreshed", extra={"scope": payload.get("scope")})
