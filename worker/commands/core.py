"""Core commands: run, bootstrap, enqueue, dev, schema."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import UTC, datetime
from typing import Any

from worker.commands.selection import add_queue_option, one_queue
from worker.errors import ConfigError


def add_parser(subparsers: Any) -> None:
    run = subparsers.add_parser(
        "run",
        help="consume the queue until SIGTERM or SIGINT",
        description="Consume WORKER_QUEUE with the handlers in WORKER_HANDLERS until SIGTERM or SIGINT.",
    )
    run.add_argument(
        "--burst",
        action="store_true",
        help="consume until the queue is empty (retries included), print a one-line summary and exit",
    )
    run.set_defaults(func=cmd_run)

    bootstrap = subparsers.add_parser(
        "bootstrap",
        help="create the queue, its DLQ and redrive policy (and the idempotency table); safe to repeat",
        description="Create WORKER_QUEUE (or each queue of WORKER_QUEUES) and its dead-letter queue with a "
        "redrive policy at the configured endpoint, and the WORKER_IDEMPOTENCY_TABLE when set. Safe to repeat.",
    )
    bootstrap.add_argument(
        "--max-receive-count",
        type=receive_count,
        default=None,
        help="redrive maxReceiveCount (default: WORKER_MAX_RECEIVE_COUNT, else the handlers' max_attempts + 2)",
    )
    bootstrap.set_defaults(func=cmd_bootstrap)

    enqueue = subparsers.add_parser(
        "enqueue",
        help="send one job to the queue",
        description="Send one job (the envelope {type, payload, idempotency_key}) to WORKER_QUEUE: an SQS queue "
        "(prints the MessageId), or with WORKER_BACKEND=cloudtasks a Cloud Tasks queue (prints the task's name).",
    )
    enqueue.add_argument("type", help="the job type, e.g. send_email")
    enqueue.add_argument(
        "--payload",
        default="{}",
        help="the payload as a JSON object (default: {}); '-' reads it from stdin (a payload too large for an "
        "argument: --payload - < payload.json)",
    )
    enqueue.add_argument(
        "--delay-s",
        type=int,
        default=0,
        help="run after this many seconds (SQS: up to a year, past 900 s in 15-minute hops; Cloud Tasks: up to "
        "30 days)",
    )
    enqueue.add_argument(
        "--run-at",
        type=run_at_time,
        default=None,
        help="run at this time, ISO 8601 with a timezone (2026-12-01T09:00Z); as far ahead as --delay-s goes",
    )
    enqueue.add_argument("--idempotency-key", default=None, help="jobs with the same key take effect once")
    enqueue.add_argument(
        "--group-id",
        default=None,
        help="SQS FIFO queues: the MessageGroupId (default: the type); refused on Cloud Tasks",
    )
    add_queue_option(enqueue, "WORKER_QUEUE; required with several WORKER_QUEUES")
    enqueue.set_defaults(func=cmd_enqueue)

    dev = subparsers.add_parser(
        "dev",
        help="run the worker on an embedded local AWS (no account, no Docker)",
        description="Start a moto server in-process on a free loopback port, bootstrap a queue, DLQ and table, "
        "run the worker with the example handlers (plus WORKER_HANDLERS), enqueue a few demo jobs, and fire "
        "the schedules of WORKER_SCHEDULES_FILE on time.",
    )
    dev.add_argument("--port", type=int, default=0, help="port of the local AWS endpoint (default: a free one)")
    dev.add_argument("--no-demo", action="store_true", help="do not enqueue the demo jobs at start")
    dev.set_defaults(func=cmd_dev)

    schema = subparsers.add_parser(
        "schema", help="print the message envelope's JSON Schema", description="Print the envelope's JSON Schema."
    )
    schema.set_defaults(func=cmd_schema)


def cmd_run(args: argparse.Namespace) -> int:
    from worker.jobs import default_registry, import_handlers
    from worker.observability.logs import configure_logging
    from worker.runtime.service import run_loop, serve
    from worker.runtime.supervisor import resolve_processes, supervise
    from worker.settings import aws_region, load_settings

    settings = load_settings()
    if settings.backend == "cloudtasks":
        raise ConfigError("WORKER_BACKEND=cloudtasks: Cloud Tasks pushes its tasks; run `sqs-worker serve-tasks`")
    aws_region()
    configure_logging(settings)
    burst = bool(getattr(args, "burst", False))
    processes = resolve_processes(settings.processes)
    if processes > 1 and not burst:  # a burst is one process: it alone can tell when the queue is empty
        return supervise(settings, processes)
    import_handlers(settings.handlers)
    if not burst:
        run_loop(settings, serve(settings, default_registry))
        return 0
    from worker.runtime.burst import Burst, burst_settings

    settings = burst_settings(settings)
    watcher = Burst(settings, default_registry)
    run_loop(settings, serve(settings, default_registry, companions=[watcher.watch], extra_observers=[watcher]))
    print(watcher.summary(), flush=True)
    return watcher.exit_code


def cmd_bootstrap(args: argparse.Namespace) -> int:
    from worker.jobs import default_registry, import_handlers
    from worker.ops.bootstrap import ensure_queues
    from worker.settings import aws_region, load_settings

    settings = load_settings()
    region = aws_region()
    if settings.backend == "cloudtasks":
        from worker.commands.tasks import bootstrap_tables

        print("\n".join(asyncio.run(bootstrap_tables(region))) or "no tables configured")
        return 0
    import_handlers(settings.handlers)
    chosen = args.max_receive_count or settings.max_receive_count
    largest = max((spec.max_attempts for spec in default_registry.specs()), default=0)
    if chosen is not None and chosen <= largest:
        print(
            f"warning: maxReceiveCount {chosen} is not above the largest max_attempts ({largest}): SQS "
            "would move retried messages to the DLQ before the worker dead-letters them (without their reason)",
            file=sys.stderr,
        )
    client = sqs_client(region)
    for spec in settings.queue_set():  # a set: each queue with its own DLQ, highest priority first
        fifo = spec.queue.endswith(".fifo")
        max_receive_count = chosen or default_registry.max_receive_count(fifo=fifo)
        created = ensure_queues(
            client,
            spec.queue,
            dlq=settings.dead_letter_queue,
            max_receive_count=max_receive_count,
            visibility_timeout_s=settings.visibility_timeout_s,
            keep_higher_count=chosen is None,  # a default never lowers a count someone raised
        )
        print(f"queue:             {created.queue_url}")
        print(f"dead-letter queue: {created.dlq_url} (maxReceiveCount {created.max_receive_count})")
        if created.dlq_size_raised_from is not None:
            print(
                f"                   MaximumMessageSize raised from {created.dlq_size_raised_from} to the queue's "
                "(a body the queue takes must fit its dead letter)"
            )
    if settings.idempotency_table:
        created_table = asyncio.run(ensure_table(region, settings.idempotency_table))
        print(f"idempotency table: {settings.idempotency_table} ({'created' if created_table else 'exists'})")
    return 0


def run_at_time(text: str) -> datetime:
    """``--run-at``: an ISO 8601 date and time with a timezone (``Z`` or an offset)."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 date and time: {text!r}") from None
    if moment.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no timezone: end it with Z or an offset such as +01:00")
    try:
        moment.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00:00+01:00: no UTC time
        raise argparse.ArgumentTypeError(f"{text!r} has no UTC time (out of range)") from None
    return moment


def receive_count(text: str) -> int:
    """argparse type of --max-receive-count: SQS accepts 1 to 1000."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError("must be between 1 and 1000")
    return value


async def ensure_table(region: str, name: str) -> bool:
    """Create the idempotency table unless it exists (``region`` is the settings' region: kept for callers)."""
    from worker.backends.aws import async_client
    from worker.idempotency import create_table

    async with async_client("dynamodb") as client:
        return await create_table(client, name)


def sqs_client(region: str) -> Any:
    """The CLI's blocking SQS client (``worker.backends.aws.sync_client``; ``region`` is the settings' region)."""
    from worker.backends.aws import sync_client

    return sync_client("sqs")


def cmd_enqueue(args: argparse.Namespace) -> int:
    from worker.backends.aws import resolve_queue_url_sync
    from worker.envelope import parse_envelope
    from worker.errors import InvalidMessage
    from worker.producer import Job, enqueue
    from worker.settings import aws_region, load_settings

    text = sys.stdin.read() if args.payload == "-" else args.payload
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--payload is not JSON: {exc.msg}") from None
    except (RecursionError, ValueError):  # too deep, or an integer of too many digits: the worker's words for it
        try:
            parse_envelope(text)  # fails as json.loads did (what it reads, envelope_body checks on sending)
        except InvalidMessage as refusal:
            raise ConfigError(f"--payload: the worker would refuse it ({refusal}); nothing sent") from None
        raise
    if not isinstance(payload, dict):
        raise ConfigError('--payload must be a JSON object, e.g. \'{"to": "a@example.com"}\'')
    settings = load_settings()
    payload = _validated(args.type, payload, settings.handlers)
    if settings.backend == "cloudtasks":
        from worker.commands.tasks import cmd_enqueue_task

        return cmd_enqueue_task(args, payload)
    client = sqs_client(aws_region())
    queue_url = resolve_queue_url_sync(client, one_queue(settings, args.queue, "enqueue"))
    message_id = enqueue(
        client,
        queue_url,
        Job(args.type, payload, args.idempotency_key, args.delay_s, args.group_id, run_at=args.run_at),
    )
    print(message_id)
    return 0


def _validated(job_type: str, payload: dict[str, Any], handlers: list[str]) -> dict[str, Any]:
    """The payload as ``.enqueue`` sends it when WORKER_HANDLERS imports and registers ``job_type`` with a model
    (ConfigError naming the fields when it is invalid: nothing sent); else the payload as given. Handler modules
    that do not import are noted on stderr, and the payload is sent as given."""
    from worker.enqueue import JobRef
    from worker.jobs import default_registry, import_handlers

    try:
        import_handlers(handlers)
    except ConfigError as exc:
        print(f"sqs-worker: note: payload not validated: {exc}", file=sys.stderr)
        return payload
    spec = default_registry.get(job_type)
    if spec is None or spec.payload_model is None:
        return payload
    return JobRef(job_type, spec.payload_model).payload_of(payload)


def cmd_schema(args: argparse.Namespace) -> int:
    from worker.envelope import envelope_schema

    json.dump(envelope_schema(), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def cmd_dev(args: argparse.Namespace) -> int:
    from worker.dev.server import run_dev

    return run_dev(port=args.port, demo=not args.no_demo)
