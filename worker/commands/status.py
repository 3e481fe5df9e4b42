"""``sqs-worker status KEY [--json] [--table NAME]``: what happened to the job with idempotency key KEY, or to
the workflow (chain or group) with id KEY.

Prints the ledger record: state (RUNNING, RETRY_PENDING, LEASE_LAPSED, COMPLETED, FAILED, EXPIRED), attempts,
last error, progress, result, owner and lease. For a workflow: its state, n of m steps or members done, the
failed ones, and the result of its last step or callback. The table is WORKER_IDEMPOTENCY_TABLE unless --table is given.
Exit code 0 when a record exists, 3 when there is none (never claimed, or expired and swept), 2 when the table
cannot be read (unreachable endpoint, refused credentials, no access, no such table) or on a configuration error.
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
from worker.idempotency import Ledger, Record, storage_key
from worker.idempotency.keys import is_worker_item
from worker.settings import load_settings
from worker.workflows import WorkflowStatus, load_status

#: The command reads the ledger only; WORKER_QUEUE need not be set where it runs.
_NO_QUEUE = "(not used by the status command)"


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "status",
        help="show a job's ledger record by idempotency key: state, attempts, last error, progress, result",
        description=plain_help(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("key", metavar="KEY", help="the idempotency key (as in ctx.idempotency_key), or a workflow id")
    parser.add_argument("--json", action="store_true", help="print the record as one JSON object")
    parser.add_argument("--table", default=None, help="the table (default: WORKER_IDEMPOTENCY_TABLE)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    table = args.table or load_settings(queue=_NO_QUEUE, queues="").idempotency_table
    if not table:
        raise ConfigError("no idempotency table: set WORKER_IDEMPOTENCY_TABLE or pass --table")
    if not args.key:
        raise ConfigError("KEY is empty: give a job's idempotency key or a workflow id")
    try:
        stored = storage_key(args.key)
    except UnicodeEncodeError:  # bytes of the command line that are not UTF-8
        raise ConfigError(f"KEY {args.key!r} is not valid UTF-8, as no idempotency key is") from None
    if is_worker_item(stored):
        print(f"{args.key!r} names the worker's own item (a rate limit, breaker or worker), not a job", file=sys.stderr)
        return NOT_FOUND_EXIT
    try:
        found = asyncio.run(fetch_any(table, stored))
    except ValueError as exc:  # an item of the table that is no job record (written by something else)
        print(f"{args.key!r} holds no job record in table {table!r}: {exc}", file=sys.stderr)
        return NOT_FOUND_EXIT
    now_ms = int(time.time() * 1000)
    if isinstance(found, WorkflowStatus):
        print(json.dumps(found.to_json(), ensure_ascii=False) if args.json else found.format())
        return 0
    record = found
    if record is None:
        if args.json:
            print(json.dumps({"key": args.key, "state": None}))
        else:
            print(f"no record for key {args.key!r} in table {table!r} (never claimed, or expired)", file=sys.stderr)
        return NOT_FOUND_EXIT
    if args.json:
        print(json.dumps(record.to_json(now_ms), ensure_ascii=False))
    else:
        print(format_record(record, now_ms))
    return 0


async def fetch_any(table: str, key: str) -> Record | WorkflowStatus | None:
    """The ledger record of ``key``, or the status of the workflow ``key`` (or ``workflow:key``)."""
    async with async_client("dynamodb") as client:
        status = await load_status(client, table, key, budget=NO_RETRY)
        if status is not None:
            return status
        return await Ledger(client, table, owner="sqs-worker-status", budget=NO_RETRY).get(key)


async def fetch(table: str, key: str) -> Record | None:
    """One read; botocore's CLI attempts are its only retries."""
    async with async_client("dynamodb") as client:
        return await Ledger(client, table, owner="sqs-worker-status", budget=NO_RETRY).get(key)


def format_record(record: Record, now_ms: int) -> str:
    """The record as aligned ``label: value`` lines for a terminal."""
    progress = "-"
    if record.progress is not None:
        progress = f"{record.progress:g}%" + (f" ({record.progress_note})" if record.progress_note else "")
    result = "-"
    if record.result is not None:
        result = json.dumps(record.result, ensure_ascii=False)
    elif record.result_note:
        result = record.result_note
    owner = f"{record.owner} (token {record.token})" if record.owner else f"- (token {record.token})"
    rows = [
        ("key", record.key),
        ("state", record.state(now_ms).value),
        ("job type", record.job_type or "-"),
        ("attempts", str(record.attempts)),
        ("last error", record.last_error or "-"),
        ("progress", progress),
        ("result", result),
        ("owner", owner),
        ("lease", _lease(record, now_ms)),
        ("created", _iso_ms(record.created_at)),
        ("updated", _iso_ms(record.updated_at)),
        ("expires", _iso_ms(record.expiration * 1000)),
    ]
    width = max(len(label) for label, _ in rows) + 1
    return "\n".join(f"{label + ':':<{width}} {value}" for label, value in rows)


def _lease(record: Record, now_ms: int) -> str:
    if record.lease_expires_at_ms <= 0:
        return "none"
    remaining_s = (record.lease_expires_at_ms - now_ms) / 1000
    if remaining_s > 0:
        return f"{remaining_s:.1f} s left"
    return f"lapsed {-remaining_s:.1f} s ago"


def _iso_ms(epoch_ms: int) -> str:
    if epoch_ms <= 0:
        return "-"
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
