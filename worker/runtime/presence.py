"""Worker presence: with an idempotency table configured, each worker puts one small item there every
PRESENCE_INTERVAL_S (one PutItem, about 1 WCU), with a TTL, so the dashboard can list the workers alive, their
concurrency, busy slots and job counts, by a Query of the table's status index (never a Scan).

The item: ``key`` = ``sqs-worker#worker#<owner>``, ``status`` = ``WORKER``, ``updated_at`` (epoch ms),
``expiration`` (epoch s, for DynamoDB's TTL sweep) and ``detail`` (JSON: queue, host, pid, concurrency, busy,
counts of succeeded/retried/dead-lettered jobs since the start). A worker whose item is older than
PRESENCE_STALE_S is not alive. Writing it never stops or slows the worker: a failed put is logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections import Counter
from typing import Any

from worker.observability.events import Event, Kind
from worker.settings import WorkerSettings

log = logging.getLogger("worker.presence")

PRESENCE_PREFIX = "sqs-worker#worker#"
PRESENCE_STATUS = "WORKER"
PRESENCE_INTERVAL_S = 15.0
#: A worker is alive while its item is younger than this (three missed puts in a row).
PRESENCE_STALE_S = 3 * PRESENCE_INTERVAL_S
#: DynamoDB removes the item some time after this (its TTL sweep is lazy; readers check PRESENCE_STALE_S).
PRESENCE_TTL_S = 3600

COUNTED = {Kind.SUCCEEDED: "succeeded", Kind.RETRY_SCHEDULED: "retried", Kind.DEAD_LETTERED: "dead_lettered"}


class PresenceObserver:
    """Counts finished jobs and keeps the latest busy count (from the runtime's gauge) for the presence item."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.busy = 0

    def emit(self, event: Event) -> None:
        name = COUNTED.get(event.kind)
        if name is not None:
            self.counts[name] += 1

    def gauge(self, *, in_flight: int, free_slots: int, stuck_threads: int = 0) -> None:
        self.busy = in_flight

    def connectivity(self, *, service: str, reachable: bool) -> None:
        return None


def presence_item(
    *, owner: str, queue: str, concurrency: int, busy: int, counts: dict[str, int], now_s: float
) -> dict[str, Any]:
    """The item, as DynamoDB attribute values (pure)."""
    detail = {
        "owner": owner,
        "queue": queue,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "concurrency": concurrency,
        "busy": busy,
        "counts": {name: counts.get(name, 0) for name in COUNTED.values()},
    }
    return {
        "key": {"S": PRESENCE_PREFIX + owner},
        "status": {"S": PRESENCE_STATUS},
        "updated_at": {"N": str(int(now_s * 1000))},
        "expiration": {"N": str(int(now_s) + PRESENCE_TTL_S)},
        "detail": {"S": json.dumps(detail, separators=(",", ":"))},
    }


def presence_companion(settings: WorkerSettings, observer: PresenceObserver) -> Any:
    """The periodic task ``serve`` runs beside the worker (a Companion: it gets ``stop``)."""
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"

    async def companion(stop: asyncio.Event) -> None:
        from worker.backends.aws import async_client

        table = settings.idempotency_table
        failing = False
        async with async_client("dynamodb", connection=settings.aws().client_kwargs()) as client:
            while not stop.is_set():
                item = presence_item(
                    owner=owner,
                    queue=settings.queue,
                    concurrency=settings.concurrency,
                    busy=min(observer.busy, settings.concurrency),  # held beyond it: prefetched, not running
                    counts=dict(observer.counts),
                    now_s=time.time(),
                )
                try:
                    await client.put_item(TableName=table, Item=item)
                    failing = False
                except Exception as exc:  # never the worker's failure; said once per outage
                    if not failing:
                        log.warning("could not write the worker's presence item: %s", exc)
                    failing = True
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=PRESENCE_INTERVAL_S)

    return companion
