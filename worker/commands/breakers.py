"""``sqs-worker breakers list|reset KEY``: the circuit breakers the fleet shares in the idempotency table.

``list`` prints each breaker the table knows: its key, state (closed, open, half_open), failures counted in the
current window, and until when it is open or its probe's lease runs. ``reset KEY`` closes a breaker at once (its
item is deleted; the next failure starts a new window); exit 3 when the table holds no breaker KEY. The table is
WORKER_IDEMPOTENCY_TABLE unless --table is given; without a table breakers are local to each worker and there is
nothing to list.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from datetime import UTC, datetime
from typing import Any

from worker.backends.aws import async_client
from worker.budgets import NO_RETRY
from worker.commands import NOT_FOUND_EXIT, plain_help
from worker.errors import ConfigError
from worker.flow.breaker import Record, State
from worker.flow.store import DynamoFlowStore
from worker.settings import load_settings

_NO_QUEUE = "(not used by the breakers command)"


def add_parser(subparsers: Any) -> None:
    breakers = subparsers.add_parser(
        "breakers",
        help="list the circuit breakers shared in the table, or reset one",
        description=plain_help(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = breakers.add_subparsers(dest="breakers_command", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="print every breaker: key, state, failures, open until")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    listing.add_argument("--table", default=None, help="the table (default: WORKER_IDEMPOTENCY_TABLE)")
    listing.set_defaults(func=cmd_list)
    reset = actions.add_parser("reset", help="close breaker KEY now")
    reset.add_argument("key", metavar="KEY", help="the breaker's key (as `list` prints it)")
    reset.add_argument("--table", default=None, help="the table (default: WORKER_IDEMPOTENCY_TABLE)")
    reset.set_defaults(func=cmd_reset)


def _table(args: argparse.Namespace) -> str:
    table: str | None = args.table or load_settings(queue=_NO_QUEUE).idempotency_table
    if not table:
        raise ConfigError(
            "no table: set WORKER_IDEMPOTENCY_TABLE or pass --table (without one, breakers are local to each worker)"
        )
    return table


def cmd_list(args: argparse.Namespace) -> int:
    table = _table(args)

    async def fetch() -> dict[str, Record]:
        async with async_client("dynamodb") as client:
            return await DynamoFlowStore(client, table, budget=NO_RETRY).breakers()

    records = asyncio.run(fetch())
    now_ms = int(time.time() * 1000)
    for key, record in records.items():
        if args.json:
            print(json.dumps(describe(key, record, now_ms), ensure_ascii=False))
        else:
            print(format_line(key, record, now_ms))
    if not records and not args.json:
        print(f"no circuit breakers in table {table!r}", file=sys.stderr)
    return 0


def cmd_reset(args: argparse.Namespace) -> int:
    table = _table(args)

    async def reset() -> bool:
        async with async_client("dynamodb") as client:
            return await DynamoFlowStore(client, table, budget=NO_RETRY).reset_breaker(args.key)

    if not asyncio.run(reset()):
        print(f"no circuit breaker {args.key!r} in table {table!r}", file=sys.stderr)
        return NOT_FOUND_EXIT
    print(f"circuit breaker {args.key!r} reset to closed")
    return 0


def describe(key: str, record: Record, now_ms: int) -> dict[str, Any]:
    """A breaker as JSON fields; ``state`` is what a worker would act on now (an open one past its cool-down
    lets a probe through)."""
    return {
        "key": key,
        "state": record.state.value,
        "failures": record.failures,
        "open_until": _iso_ms(record.open_until_ms) if record.state is State.OPEN else None,
        "probe_until": _iso_ms(record.probe_until_ms) if record.state is State.HALF_OPEN else None,
        "probe_due": record.state is State.OPEN and now_ms >= record.open_until_ms,
        "changed_at": _iso_ms(record.changed_at_ms),
    }


def format_line(key: str, record: Record, now_ms: int) -> str:
    fields = describe(key, record, now_ms)
    detail = f"failures {record.failures}"
    if record.state is State.OPEN:
        detail = f"open until {fields['open_until']}" + (
            " (cool-down over: next job probes)" if fields["probe_due"] else ""
        )
    elif record.state is State.HALF_OPEN and fields["probe_until"] is None:  # a probe given back (not counted)
        detail = "no probe running: the next job probes"
    elif record.state is State.HALF_OPEN:
        detail = f"probe running until {fields['probe_until']} at the latest"
    return f"{key}\t{record.state.value}\t{detail}"


def _iso_ms(epoch_ms: int) -> str | None:
    if epoch_ms <= 0:
        return None
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
