"""``sqs-worker dev``: the worker on an embedded local AWS, with example handlers, demo jobs and schedules."""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from worker.localaws import LocalAws

if TYPE_CHECKING:
    from worker.service import Companion

DEV_QUEUE = "sqs-worker-dev"
DEV_TABLE = "sqs-worker-dev-idempotency"
DEMO_JOBS: list[tuple[str, dict[str, object], str | None]] = [
    ("send_email", {"to": "ada@example.com", "subject": "Welcome", "body": "Hello!"}, None),
    ("flaky_webhook", {"url": "https://example.com/hook", "succeed_on_attempt": 2}, None),
    ("import_rows", {"rows": 40}, None),
    ("charge_card", {"order": "A-1001", "amount_cents": 1999}, "order-A-1001"),
    ("charge_card", {"order": "A-1001", "amount_cents": 1999}, "order-A-1001"),
    ("send_email", {"to": "not-an-address", "subject": "Bad payload"}, None),
]


def run_dev(*, port: int = 0, demo: bool = True) -> int:
    for name, value in (("AWS_ACCESS_KEY_ID", "dev"), ("AWS_SECRET_ACCESS_KEY", "dev")):
        os.environ.setdefault(name, value)
    if not (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")):
        os.environ["AWS_REGION"] = "us-east-1"
    os.environ.setdefault("WORKER_QUEUE", DEV_QUEUE)
    os.environ.setdefault("WORKER_IDEMPOTENCY_TABLE", DEV_TABLE)
    os.environ.setdefault("WORKER_LOG_FORMAT", "text")
    os.environ.setdefault("WORKER_METRICS", "off")
    os.environ.setdefault("WORKER_POLL_WAIT_S", "5")
    example = Path("schedules.example.yaml")
    if "WORKER_SCHEDULES_FILE" not in os.environ and example.is_file():
        os.environ["WORKER_SCHEDULES_FILE"] = str(example)
    with LocalAws(port=port or None) as aws:
        os.environ["AWS_ENDPOINT_URL"] = aws.endpoint_url
        return asyncio.run(_dev(aws.endpoint_url, demo=demo))


async def _dev(endpoint_url: str, *, demo: bool) -> int:
    from worker.bootstrap import ensure_queues
    from worker.commands.core import default_max_receive_count, ensure_table, sqs_client
    from worker.jobs import default_registry, import_handlers
    from worker.logs import configure_logging
    from worker.producer import Job, enqueue_many
    from worker.service import serve
    from worker.settings import aws_region, load_settings

    settings = load_settings()
    configure_logging(settings)
    import_handlers(["worker.examples", *settings.handlers])
    region = aws_region()
    client = sqs_client(region)
    created = ensure_queues(client, settings.queue, max_receive_count=default_max_receive_count())
    if settings.idempotency_table:
        await ensure_table(region, settings.idempotency_table)
    companions: list[Companion] = []
    schedules_note = "no schedules file (set WORKER_SCHEDULES_FILE)"
    if settings.schedules_file:
        companions.append(_scheduler(settings.schedules_file, created.queue_url))
        schedules_note = f"firing the schedules of {settings.schedules_file} on time"
    print(
        f"""
sqs-worker dev: local AWS at {endpoint_url}
  queue {created.queue_url}
  DLQ   {created.dlq_url}
  {schedules_note}
Enqueue from another shell (plain boto3 works with the same variables):
  export AWS_ENDPOINT_URL={endpoint_url} AWS_REGION={region} AWS_DEFAULT_REGION={region} \\
    AWS_ACCESS_KEY_ID=dev AWS_SECRET_ACCESS_KEY=dev WORKER_QUEUE={settings.queue}
  {cli_path()} enqueue send_email --payload '{{"to": "you@example.com", "subject": "Hi"}}'
Stop with Ctrl-C.
""",
        file=sys.stderr,
        flush=True,
    )
    if demo:
        jobs = [Job(job_type, payload, key) for job_type, payload, key in DEMO_JOBS]
        await asyncio.to_thread(enqueue_many, client, created.queue_url, jobs)
    await serve(settings, default_registry, companions=companions)
    return 0


def cli_path() -> str:
    """The ``sqs-worker`` command as another shell can run it: the venv's script is not always on PATH."""
    script = Path(sys.executable).with_name("sqs-worker")
    return str(script) if script.is_file() else "sqs-worker"


def _scheduler(path: str, queue_url: str) -> Companion:
    from worker.schedules import Schedule, load_schedules, run_local_scheduler

    schedules = load_schedules(path)

    async def companion(stop: asyncio.Event) -> None:
        from aiobotocore.session import get_session

        from worker.settings import aws_region

        async with get_session().create_client("sqs", region_name=aws_region()) as client:

            async def send_body(body: str, schedule: Schedule) -> None:
                kwargs: dict[str, str] = {}
                if queue_url.endswith(".fifo"):
                    kwargs["MessageGroupId"] = schedule.name
                    kwargs["MessageDeduplicationId"] = hashlib.sha256(body.encode()).hexdigest()
                await client.send_message(QueueUrl=queue_url, MessageBody=body, **kwargs)  # type: ignore[arg-type]

            await run_local_scheduler(schedules, send_body, stop)

    return companion
