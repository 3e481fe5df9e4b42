"""``sqs-worker dlq list|show|redrive|requeue|purge``: see what failed and why, replay it, or drop it.

The DLQ is WORKER_DEAD_LETTER_QUEUE, else the redrive target of WORKER_QUEUE, else ``<queue>-dlq``. With
WORKER_QUEUES each queue has its own DLQ: list, show, redrive and requeue work on every one (each back to its own
queue), or on the one of ``--queue NAME``; purge needs ``--queue`` when the set has several queues.
Reading the DLQ (list, show, requeue) receives messages and releases them again: each read adds one to
their ApproximateReceiveCount. A message leaves the DLQ only after its copy was sent; never the other way.
With WORKER_BACKEND=cloudtasks the dead letters are the queue's records in WORKER_CLOUDTASKS_DEAD_LETTER_TABLE, their
ids the task names: redrive and requeue create new tasks, a record is deleted only after its task was created, and
--rate and --no-move-task do not apply.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from worker.backends.aws import resolve_queue_url_sync, sync_client
from worker.commands import NOT_FOUND_EXIT, plain_help
from worker.commands.selection import add_queue_option, one_queue, selected_queues
from worker.errors import ConfigError
from worker.names import queue_name_of
from worker.observability.logs import configure_logging
from worker.ops.dlq import (
    MOVE_TASK_MAX_RATE,
    DeadLetterQueue,
    MoveResult,
    now_utc,
    redrive,
    requeue,
    requeued_by,
    resolve_dlq_url,
)
from worker.ops.dlq_records import format_groups, group_dead_letters, printable, printable_json
from worker.ops.progress import Progress
from worker.settings import load_settings

DEFAULT_READ_LIMIT = 1000


def _rate(text: str) -> int:
    value = text.strip().removesuffix("/s")
    try:
        rate = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a rate: {text!r} (messages per second, e.g. 50 or 50/s)") from None
    if rate < 1:
        raise argparse.ArgumentTypeError("the rate must be at least 1 message per second")
    return rate


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "dlq",
        help="inspect and replay the dead letters (the DLQ; on Cloud Tasks the dead-letter table)",
        description=plain_help(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="dlq_command", metavar="ACTION", required=True)

    listing = actions.add_parser("list", help="dead letters grouped by category and error, with counts")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.add_argument("--limit", type=_positive, default=DEFAULT_READ_LIMIT, help="read at most N (default 1000)")
    add_queue_option(listing, "the DLQ of every queue")
    listing.set_defaults(func=_backend_switch(run_list))

    show = actions.add_parser("show", help="one dead letter: body and attributes")
    show.add_argument("id", help="the original message id or the DLQ message id (Cloud Tasks: the task name)")
    show.add_argument("--limit", type=_positive, default=DEFAULT_READ_LIMIT, help="search at most N (default 1000)")
    add_queue_option(show, "search the DLQ of every queue")
    show.set_defaults(func=_backend_switch(run_show))

    redrive = actions.add_parser(
        "redrive", help="move the dead letters back to the queue (those there when it starts, each once)"
    )
    redrive.add_argument("--rate", type=_rate, help="SQS: at most N messages per second (e.g. 50 or 50/s)")
    redrive.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    redrive.add_argument("--limit", type=_positive, help="move at most N (on SQS: the receive/send/delete path only)")
    redrive.add_argument(
        "--no-move-task", action="store_true", help="SQS: do not use StartMessageMoveTask; receive, send and delete"
    )
    add_queue_option(redrive, "each queue's DLQ back to that queue")
    redrive.set_defaults(func=_backend_switch(run_redrive))

    requeue_parser = actions.add_parser(
        "requeue", help="send chosen dead letters back as fresh messages (tasks), audited"
    )
    requeue_parser.add_argument(
        "ids", nargs="*", metavar="ID", help="original or DLQ message ids (Cloud Tasks: task names)"
    )
    requeue_parser.add_argument("--category", help="requeue every dead letter of this category instead")
    requeue_parser.add_argument(
        "--reason",
        required=True,
        help="why (SQS: the message attribute requeue_reason; Cloud Tasks: the X-Worker-Requeue-Reason header)",
    )
    requeue_parser.add_argument("--by", help="who (default: $USER)")
    requeue_parser.add_argument("--limit", type=_positive, default=DEFAULT_READ_LIMIT, help="read at most N")
    add_queue_option(requeue_parser, "the DLQ of every queue, each back to its own queue")
    requeue_parser.set_defaults(func=_backend_switch(run_requeue))

    purge = actions.add_parser(
        "purge", help="delete every dead letter (of the DLQ, or of the queue in the dead-letter table)"
    )
    purge.add_argument("--yes", action="store_true", help="required: purging cannot be undone")
    add_queue_option(purge, "the only queue; required with several WORKER_QUEUES")
    purge.set_defaults(func=_backend_switch(run_purge))


def _backend_switch(action: Any) -> Any:
    """``action`` on SQS; the dead-letter table's version of it with WORKER_BACKEND=cloudtasks."""

    def run(args: argparse.Namespace) -> int:
        try:
            cloudtasks = load_settings().backend == "cloudtasks"
        except ConfigError:  # the SQS command says what is missing, as it always did
            cloudtasks = False
        if cloudtasks:
            from worker.backends.cloudtasks.dlq import run as run_cloudtasks

            code: int = run_cloudtasks(args)
            return code
        result: int = action(args)
        return result

    return run


def open_dlqs(args: argparse.Namespace, *, only_one: str | None = None) -> list[DeadLetterQueue]:
    """The DLQ of each selected queue (``--queue``, else all), highest priority first; ``only_one``: the command
    acts on one queue only (the one ``--queue`` names, or the only one configured)."""
    settings = load_settings()
    configure_logging(settings)
    sqs = sync_client("sqs")
    name = getattr(args, "queue", None)
    queues = [one_queue(settings, name, only_one)] if only_one else selected_queues(settings, name)
    dlqs = []
    for queue in queues:
        source_url = resolve_queue_url_sync(sqs, queue)
        dlq_url = resolve_dlq_url(sqs, source_url, settings.dead_letter_queue)
        dlqs.append(DeadLetterQueue(sqs, dlq_url=dlq_url, source_url=source_url))
    return dlqs


def run_list(args: argparse.Namespace) -> int:
    documents = []
    for dlq in open_dlqs(args):
        total, in_flight = dlq.approximate_counts()
        letters = dlq.read(limit=args.limit)
        groups = group_dead_letters(letters)
        documents.append(
            {
                "dead_letter_queue": queue_name_of(dlq.dlq_url),
                "approximate_total": total,
                "approximate_in_flight": in_flight,
                "read": len(letters),
                "groups": [group.as_dict() for group in groups],
            }
        )
        if not args.json:
            print(f"dead-letter queue: {queue_name_of(dlq.dlq_url)}")
            print(format_groups(groups, read=len(letters), approximate_total=total, in_flight=in_flight))
    if args.json:  # one queue: its document; several: a list of them
        print(json.dumps(documents[0] if len(documents) == 1 else documents, indent=2))
    return 0


def _not_found(ident: str, limit: int) -> None:
    print(
        f"no dead letter with id {printable(ident)} among those read (every one visible, at most --limit {limit})",
        file=sys.stderr,
    )


def run_show(args: argparse.Namespace) -> int:
    letter = None
    for dlq in open_dlqs(args):
        letter = dlq.find(args.id, limit=args.limit)
        if letter is not None:
            break
    if letter is None:
        _not_found(args.id, args.limit)
        return NOT_FOUND_EXIT
    print(printable_json(letter.describe()))
    return 0


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        return False
    try:
        answer = input(f"{question} [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def _report(result: MoveResult, what: str) -> int:
    of = f" of {result.total}" if result.total is not None else ""
    print(f"{what}: moved {result.moved}{of} by {result.method}")
    for message_id, reason in result.failed:
        print(f"  not moved: {message_id}: {reason}", file=sys.stderr)
    if result.failed:
        print(f"{len(result.failed)} message(s) stay in the dead-letter queue", file=sys.stderr)
    return 0 if result.ok else 1


def run_redrive(args: argparse.Namespace) -> int:
    return max(_redrive(dlq, args) for dlq in open_dlqs(args))


def _redrive(dlq: DeadLetterQueue, args: argparse.Namespace) -> int:
    snapshot = dlq.snapshot()
    target = queue_name_of(dlq.source_url)
    question = f"move the {snapshot.count} message(s) now in {queue_name_of(dlq.dlq_url)} to {target}?"
    if not args.yes and not _confirm(question):
        print("not confirmed: pass --yes to redrive without a question", file=sys.stderr)
        return 2
    if snapshot.count == 0:
        return _report(MoveResult("nothing to move", total=0), f"redrive to {target}")
    if not args.no_move_task and args.limit is None and args.rate is not None and args.rate > MOVE_TASK_MAX_RATE:
        print(f"a move task moves at most {MOVE_TASK_MAX_RATE} messages/s; using that", file=sys.stderr)
    result = redrive(
        dlq,
        snapshot,
        rate_per_s=args.rate,
        move_task=not args.no_move_task,
        limit=args.limit,
        progress=Progress(sys.stderr, snapshot.count),
        on_receiving=lambda: print(
            "the endpoint has no StartMessageMoveTask: moving by receive, send, delete", file=sys.stderr
        ),
    )
    return _report(result, f"redrive to {target}")


def run_requeue(args: argparse.Namespace) -> int:
    if bool(args.ids) == bool(args.category):
        print("give message ids or --category, not both and not neither", file=sys.stderr)
        return 2
    if not args.reason.strip():
        print("--reason must say why", file=sys.stderr)
        return 2
    wanted = set(args.ids)
    found: set[str] = set()
    codes, chosen_any = [0], False
    dlqs = open_dlqs(args)
    for dlq in dlqs:  # each DLQ's letters go back to its own queue
        with dlq.held(limit=args.limit) as letters:
            if args.category:
                chosen = [letter for letter in letters if letter.category == args.category]
            else:
                chosen = [letter for letter in letters if wanted & {letter.message_id, letter.original_message_id}]
            found.update(i for i in wanted if any(letter.matches(i) for letter in chosen))
            if not chosen and len(dlqs) > 1:
                continue  # several DLQs: report only those it requeued from
            chosen_any = chosen_any or bool(chosen)
            result = requeue(dlq, chosen, by=requeued_by(args.by), reason=args.reason.strip(), at=now_utc())
        for old_id, new_id in result.new_message_ids:
            print(f"requeued {old_id} as {new_id}")
        codes.append(_report(result, f"requeue to {queue_name_of(dlq.source_url)}"))
    missing = sorted(wanted - found)
    for ident in missing:  # not a message left behind: there is none with that id (among those read)
        _not_found(ident, args.limit)
    if not chosen_any and args.category:  # nothing by that name (a typo'd category is no success)
        print(f"no dead letters of category '{printable(args.category)}'", file=sys.stderr)
        return NOT_FOUND_EXIT
    return 1 if missing else max(codes)


def run_purge(args: argparse.Namespace) -> int:
    if not args.yes:
        print("refusing to purge without --yes: purging deletes every dead letter for good", file=sys.stderr)
        return 2
    (dlq,) = open_dlqs(args, only_one="purge")
    total = dlq.approximate_count()
    dlq.purge()
    print(f"purged {queue_name_of(dlq.dlq_url)} (about {total} message(s))")
    return 0
