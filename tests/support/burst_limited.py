"""A rate-limited handler for ``sqs-worker run --burst``: its holds (about 12 s) outlast the burst's idle bound."""

from __future__ import annotations

from typing import Any

from tests.support.burst_handlers import record
from worker import job


@job("limited", max_attempts=3, backoff_base_s=1, backoff_max_s=1, rate_limit="1/16s")
async def limited(payload: dict[str, Any]) -> None:
    record(f"limited {payload['n']}")
