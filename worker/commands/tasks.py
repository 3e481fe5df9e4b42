"""``sqs-worker serve-tasks``: run the handlers behind a Google Cloud Tasks push queue (WORKER_BACKEND=cloudtasks)."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from worker.errors import ConfigError


def add_parser(subparsers: Any) -> None:
    serve = subparsers.add_parser(
        "serve-tasks",
        help="serve Cloud Tasks deliveries (HTTP) until SIGTERM or SIGINT",
        description="Listen on WORKER_CLOUDTASKS_HOST:WORKER_CLOUDTASKS_PORT for the tasks a Google Cloud Tasks "
        "queue pushes, run them with the handlers in WORKER_HANDLERS, dead-letter into "
        "WORKER_CLOUDTASKS_DEAD_LETTER_TABLE; /healthz and /readyz on the same port.",
    )
    serve.add_argument("--port", type=int, default=None, help="listen here (default: WORKER_CLOUDTASKS_PORT, 8080)")
    serve.set_defaults(func=cmd_serve_tasks)


def require_gcp_extra(*modules: str) -> None:
    """A ConfigError naming the ``gcp`` extra when its packages are not installed."""
    import importlib.util

    def absent(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is None
        except ModuleNotFoundError:  # a parent package is missing
            return True

    missing = [name for name in modules if absent(name)]
    if missing:
        raise ConfigError(
            f"WORKER_BACKEND=cloudtasks needs the gcp extra ({', '.join(missing)} missing): "
            'pip install "sqs-worker[gcp] @ <path or git URL of sqs-worker>"'
        )


def cmd_serve_tasks(args: argparse.Namespace) -> int:
    require_gcp_extra("uvicorn", "starlette", "jwt")
    from worker.backends.cloudtasks.server import serve_tasks
    from worker.backends.cloudtasks.settings import load_cloudtasks_settings
    from worker.jobs import default_registry, import_handlers
    from worker.observability.logs import configure_logging
    from worker.settings import aws_region, load_settings

    settings = load_settings()
    overrides: dict[str, object] = {} if args.port is None else {"port": args.port}
    cloudtasks = load_cloudtasks_settings(**overrides)
    aws_region()
    configure_logging(settings)
    import_handlers(settings.handlers)
    asyncio.run(serve_tasks(settings, default_registry, cloudtasks=cloudtasks))
    return 0


def cmd_enqueue_task(args: argparse.Namespace, payload: dict[str, Any]) -> int:
    """``sqs-worker enqueue`` with WORKER_BACKEND=cloudtasks: prints the task's name."""
    import sys

    require_gcp_extra("google.cloud.tasks_v2")

    from worker.backends.cloudtasks.producer import create_task, job_task, tasks_client
    from worker.backends.cloudtasks.settings import load_cloudtasks_settings
    from worker.producer import Job
    from worker.settings import load_settings

    settings = load_settings()
    cloudtasks = load_cloudtasks_settings()
    job = Job(args.type, payload, args.idempotency_key, args.delay_s, args.group_id, run_at=args.run_at)
    queue_path, task = job_task(cloudtasks, settings.queue, job)  # a wrong setting or job before any connection
    created = create_task(tasks_client(cloudtasks), cloudtasks, queue_path, task)
    if not created.created:
        print("a task of this name exists already: deduplicated by Cloud Tasks", file=sys.stderr)
    print(created.name)
    return 0


async def bootstrap_tables(region: str) -> list[str]:
    """``sqs-worker bootstrap`` with WORKER_BACKEND=cloudtasks: the dead-letter table (and the idempotency table);
    the queue itself is made with gcloud (README)."""
    from worker.backends.aws import async_client
    from worker.backends.cloudtasks.deadletters import create_dead_letter_table
    from worker.backends.cloudtasks.settings import load_cloudtasks_settings
    from worker.idempotency import create_table
    from worker.settings import load_settings

    settings = load_settings()
    cloudtasks = load_cloudtasks_settings()
    lines = []
    async with async_client("dynamodb") as client:
        if cloudtasks.dead_letter_table:
            created = await create_dead_letter_table(client, cloudtasks.dead_letter_table)
            lines.append(f"dead-letter table: {cloudtasks.dead_letter_table} ({'created' if created else 'exists'})")
        if settings.idempotency_table:
            created = await create_table(client, settings.idempotency_table)
            lines.append(f"idempotency table: {settings.idempotency_table} ({'created' if created else 'exists'})")
    return lines
