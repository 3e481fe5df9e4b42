"""The ``dlq`` commands on the Cloud Tasks backend (WORKER_BACKEND=cloudtasks): the dead-letter table instead of
an SQS DLQ, with the same listing, record view and exit codes.

- list / show: read records (``show`` takes the task name, which is the record's ``original_message_id``).
- redrive: each record read becomes a new task with the same body (a fresh name: a used name is refused by
  Cloud Tasks for a while), then the record is deleted; a record whose task could not be created stays.
- requeue: the same for chosen records, the task carrying the audit as headers (``X-Worker-Requeued-By``,
  ``X-Worker-Requeued-At``, ``X-Worker-Requeue-Reason``, ``X-Worker-Requeued-From``), each value percent-encoded
  UTF-8 outside printable ASCII (and ``%``): HTTP carries header values as Latin-1 at best, and a task whose header
  cannot be encoded is never delivered.
- purge: delete every record of the queue.
A record leaves the table only after its new task was created; never the other way.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

from worker.backends.cloudtasks.deadletters import DeadLetterStore, StoredDeadLetter
from worker.backends.cloudtasks.producer import build_task, create_task, tasks_client
from worker.backends.cloudtasks.settings import CloudTasksSettings, load_cloudtasks_settings
from worker.errors import ConfigError, QueueUnavailable
from worker.ops.dlq import MoveResult, now_utc, requeued_by
from worker.ops.dlq_records import DeadLetter, format_groups, group_dead_letters, printable, printable_json
from worker.settings import load_settings

AUDIT_HEADERS = {
    "requeued_by": "X-Worker-Requeued-By",
    "requeued_at": "X-Worker-Requeued-At",
    "requeue_reason": "X-Worker-Requeue-Reason",
    "requeued_from": "X-Worker-Requeued-From",
}

#: What a header value holds as is: printable ASCII but ``%`` (anything else is percent-encoded UTF-8).
HEADER_SAFE = "".join(chr(code) for code in range(0x20, 0x7F) if chr(code) != "%")


def audit_headers(audit: dict[str, str], requeued_from: str) -> dict[str, str]:
    """The requeue's audit as task headers: values percent-encoded UTF-8 outside printable ASCII and ``%`` (decode
    with ``urllib.parse.unquote``)."""
    values = {**audit, "requeued_from": requeued_from}
    return {
        AUDIT_HEADERS[name]: quote(value, safe=HEADER_SAFE, errors="surrogatepass") for name, value in values.items()
    }


def as_dead_letter(record: StoredDeadLetter) -> DeadLetter:
    """A record in the form the SQS listing reads (same grouping, same ``show`` document)."""
    return DeadLetter(
        message_id=record.task,
        receipt_handle="",
        body=record.body.decode("utf-8", "surrogateescape"),
        attributes={name: {"DataType": "String", "StringValue": value} for name, value in record.attributes.items()},
        system={"queue": record.queue, **record.extra},
    )


@contextlib.asynccontextmanager
async def open_store() -> AsyncIterator[tuple[DeadLetterStore, CloudTasksSettings, str]]:
    from worker.backends.aws import async_client

    settings = load_settings()
    cloudtasks = load_cloudtasks_settings()
    if not cloudtasks.dead_letter_table:
        raise ConfigError("WORKER_CLOUDTASKS_DEAD_LETTER_TABLE is not set")
    queue = settings.queue.rsplit("/", 1)[-1]
    async with async_client("dynamodb", connection=settings.aws().client_kwargs()) as client:
        yield DeadLetterStore(client, cloudtasks.dead_letter_table, queue), cloudtasks, settings.queue


def run(args: argparse.Namespace) -> int:
    """The ``dlq`` action of ``args`` on the Cloud Tasks backend."""
    from worker.commands.tasks import require_gcp_extra

    require_gcp_extra("google.cloud.tasks_v2")
    action = {
        "list": _list,
        "show": _show,
        "redrive": _redrive,
        "requeue": _requeue,
        "purge": _purge,
    }[args.dlq_command]
    return asyncio.run(action(args))


async def _list(args: argparse.Namespace) -> int:
    async with open_store() as (store, _, _queue):
        records = await store.list(limit=args.limit)
    letters = [as_dead_letter(record) for record in records]
    groups = group_dead_letters(letters)
    total = len(letters) if len(letters) < args.limit else None
    if args.json:
        import json

        document = {
            "dead_letter_table": store.table,
            "queue": store.queue,
            "approximate_total": total,
            "read": len(letters),
            "groups": [group.as_dict() for group in groups],
        }
        print(json.dumps(document, indent=2))
    else:
        print(f"dead-letter table: {store.table} (queue {store.queue})")
        print(format_groups(groups, read=len(letters), approximate_total=total))
    return 0


async def _show(args: argparse.Namespace) -> int:
    async with open_store() as (store, _, _queue):
        record = await store.get(args.id)
    if record is None:
        print(f"no dead letter with id {printable(args.id)} in {store.table}", file=sys.stderr)
        return 3  # as dlq show on SQS: no such dead letter
    print(printable_json(as_dead_letter(record).describe()))
    return 0


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        return False
    try:
        return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")
    except EOFError:
        return False


async def _move(
    store: DeadLetterStore,
    cloudtasks: CloudTasksSettings,
    queue: str,
    records: list[StoredDeadLetter],
    *,
    method: str,
    audit: dict[str, str] | None = None,
) -> MoveResult:
    """Create a task for each record, then delete the record."""
    queue_path = cloudtasks.queue_path(queue)
    client = tasks_client(cloudtasks)
    result = MoveResult(method, total=len(records))
    for record in records:
        headers = {} if audit is None else audit_headers(audit, record.task)
        try:  # the record is deleted only once its new task exists
            task = build_task(cloudtasks, queue_path, record.body, headers=headers)
            created = await asyncio.to_thread(create_task, client, cloudtasks, queue_path, task)
        except (ConfigError, QueueUnavailable) as exc:
            result.failed.append((record.task, str(exc)))
            continue
        try:
            await store.delete(record)
        except (ConfigError, QueueUnavailable) as exc:
            result.failed.append((record.task, f"task created as {created.name}, record not deleted: {exc}"))
            continue
        result.moved += 1
        result.new_message_ids.append((record.task, created.name.rsplit("/", 1)[-1]))
    return result


def _report(result: MoveResult, what: str) -> int:
    print(f"{what}: moved {result.moved} of {result.total} by {result.method}")
    for task, reason in result.failed:
        print(f"  not moved: {task}: {reason}", file=sys.stderr)
    if result.failed:
        print(f"{len(result.failed)} record(s) stay in the dead-letter table", file=sys.stderr)
    return 0 if result.ok else 1


async def _redrive(args: argparse.Namespace) -> int:
    async with open_store() as (store, cloudtasks, queue):
        records = await store.list(limit=args.limit or 1_000_000)
        question = f"create {len(records)} task(s) again on {store.queue} from {store.table}?"
        if not args.yes and not _confirm(question):
            print("not confirmed: pass --yes to redrive without a question", file=sys.stderr)
            return 2
        result = await _move(store, cloudtasks, queue, records, method="CreateTask")
    return _report(result, f"redrive to {store.queue}")


async def _requeue(args: argparse.Namespace) -> int:
    if bool(args.ids) == bool(args.category):
        print("give task names or --category, not both and not neither", file=sys.stderr)
        return 2
    if not args.reason.strip():
        print("--reason must say why", file=sys.stderr)
        return 2
    async with open_store() as (store, cloudtasks, queue):
        if args.category:
            chosen = [r for r in await store.list(limit=args.limit) if r.category == args.category]
            missing: list[str] = []
        else:
            found = {ident: await store.get(ident) for ident in dict.fromkeys(args.ids)}
            chosen = [record for record in found.values() if record is not None]
            missing = [ident for ident, record in found.items() if record is None]
        audit = {
            "requeued_by": requeued_by(args.by),
            "requeued_at": _iso(now_utc()),
            "requeue_reason": args.reason.strip(),
        }
        result = await _move(store, cloudtasks, queue, chosen, method="requeue", audit=audit)
    for old, new in result.new_message_ids:
        print(f"requeued {old} as {new}")
    for ident in missing:
        print(f"no dead letter with id {printable(ident)} in {store.table}", file=sys.stderr)
    if not chosen and args.category:  # nothing by that name, as dlq show (exit 3)
        print(f"no dead letters of category '{printable(args.category)}'", file=sys.stderr)
        return 3
    code = _report(result, f"requeue to {store.queue}")
    return 1 if missing else code


async def _purge(args: argparse.Namespace) -> int:
    if not args.yes:
        print("refusing to purge without --yes: purging deletes every dead letter for good", file=sys.stderr)
        return 2
    async with open_store() as (store, _, _queue):
        records = await store.list(limit=1_000_000)
        for record in records:
            await store.delete(record)
    print(f"purged {len(records)} dead letter(s) of {store.queue} from {store.table}")
    return 0


def _iso(moment: Any) -> str:
    from worker.deadletter import iso_utc

    return iso_utc(moment)
