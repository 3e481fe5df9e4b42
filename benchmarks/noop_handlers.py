"""The no-op job for ``sqs-worker run`` in benchmarks/compare_celery.py (WORKER_HANDLERS=benchmarks.noop_handlers).

It does what the Celery task in benchmarks/celery_app.py does: record one line in the side channel, nothing else.
"""

from __future__ import annotations

from typing import Any

from benchmarks.effects import record
from worker import JobContext, job


@job("noop", max_attempts=3, timeout_s=30)
async def noop(payload: dict[str, Any], ctx: JobContext) -> None:
    record(float(payload["sent_at"]))
