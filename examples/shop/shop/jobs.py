"""The shop's handlers: one ``async def`` with a payload model, one plain ``def`` (it runs in a worker thread)."""

import asyncio
from typing import Any

from shop.models import Receipt
from worker import JobContext, PermanentError, RetryableError, job

#: Stands in for a mail API: what was "sent", as (address, text).
OUTBOX: list[tuple[str, str]] = []
#: Stands in for an image store that is busy now and then: images whose next read fails once.
BUSY: set[str] = set()


async def deliver(to: str, text: str, *, idempotency_key: str | None) -> None:
    """Your mail API's client; pass it the idempotency key so a retried call sends once."""
    await asyncio.sleep(0.01)
    OUTBOX.append((to, text))


@job("send_receipt", max_attempts=4, key=lambda receipt: receipt.order_id)
async def send_receipt(payload: Receipt, ctx: JobContext) -> str:
    if payload.email.endswith(".invalid"):
        raise PermanentError("the address's domain does not exist")
    await deliver(
        payload.email,
        f"Order {payload.order_id}: {payload.total_cents / 100:.2f} EUR",
        idempotency_key=ctx.idempotency_key,
    )
    return "sent"


@job("make_thumbnail", timeout_s=60, backoff_base_s=30)
def make_thumbnail(payload: dict[str, Any]) -> dict[str, int]:
    if payload["image"] in BUSY:
        BUSY.discard(payload["image"])
        raise RetryableError("the image store is busy", delay_s=30)
    width, height = int(payload["width"]), int(payload["height"])
    return {"width": 128, "height": max(1, round(128 * height / width))}
