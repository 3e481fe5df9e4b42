"""The rate-limited job of benchmarks/rate_limit.py (WORKER_HANDLERS=benchmarks.limited_handlers): its limit is
``BENCH_RATE`` (e.g. ``60/m``), read when the module is imported; each run records its start in the side channel."""

from __future__ import annotations

import os
from typing import Any

from benchmarks.effects import record
from worker import job


@job("limited", rate_limit=os.environ.get("BENCH_RATE", "60/m"), max_attempts=3, timeout_s=30)
async def limited(payload: dict[str, Any]) -> None:
    record(float(payload["sent_at"]))
