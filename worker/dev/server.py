"""``sqs-worker dev``: the worker on an embedded local AWS, with example handlers, demo jobs and schedules."""

from __future__ import annotations

import asyncio
import hashlib
import shlex
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from worker.dev.localaws import LocalAws
from worker.dev.recipes import DEV_BUCKET, DEV_WEBHOOK_SECRET, RECIPE_MODULES, Receivers, demo_jobs, wire_recipes
from worker.settings import AwsConnection, AwsSettings, WorkerSettings, load_settings

if TYPE_CHECKING:
    from worker.runtime.service import Companion

DEV_QUEUE = "sqs-worker-dev"
DEV_TABLE = "sqs-worker-dev-idempotency"
DEV_REGION = "us-east-1"
DEV_KEY = "dev"  # the access key id and secret of the embedded server (it accepts any)
DEMO_JOBS: list[tuple[str, dict[str, object], str | None]] = [
    ("send_email", {"to": "ada@example.com", "subject": "Welcome", "body": "Hello!"}, None),
    ("flaky_webhook", {"url": "https://example.com/hook", "succeed_on_attempt": 2}, None),
    ("import_rows", {"rows": 40}, None),
    ("charge_card", {"order": "A-1001", "amount_cents": 1999}, "order-A-1001"),
    ("charge_card", {"order": "A-1001", "amount_cents": 1999}, "order-A-1001"),
    ("send_email", {"to": "not-an-address", "subject": "Bad payload"}, None),
]


def _example_schedules() -> str | None:
    example = Path("schedules.example.yaml")
    return str(example.resolve()) if example.is_file() else None


class DevSettings(WorkerSettings):
    """``sqs-worker dev``'s defaults; ``WORKER_*`` variables and ``.env`` still override them."""

    queue: str = DEV_QUEUE
    idempotency_table: str | None = DEV_TABLE
    log_format: Literal["json", "text"] = "text"
    metrics: Literal["emf", "cloudwatch", "off"] = "off"
    poll_wait_s: int = Field(default=5, ge=0, le=20)
    schedules_file: str | None = Field(default_factory=_example_schedules)


def run_dev(*, port: int = 0, demo: bool = True) -> int:
    """Start the embedded local AWS and run the worker on it; its endpoint and keys go to the clients explicitly
    (``WorkerSettings.with_aws``), the process environment is left as it is."""
    settings = load_settings(DevSettings)
    region = AwsSettings().region or DEV_REGION
    with LocalAws(port=port or None) as aws:
        connection = AwsConnection(
            region=region, endpoint_url=aws.endpoint_url, access_key_id=DEV_KEY, secret_access_key=DEV_KEY
        )
        return asyncio.run(_dev(settings.with_aws(connection), demo=demo))


async def _dev(settings: WorkerSettings, *, demo: bool) -> int:
    from worker.backends.aws import sync_client
    from worker.jobs import default_registry, import_handlers
    from worker.observability.logs import configure_logging
    from worker.ops.bootstrap import ensure_queues
    from worker.producer import Job, enqueue_many
    from worker.runtime.service import serve

    configure_logging(settings)
    receivers = _recipe_receivers(settings)
    import_handlers(["worker.examples", *(RECIPE_MODULES if receivers else []), *settings.handlers])
    connection = settings.aws()
    client = sync_client("sqs", connection=connection.client_kwargs())
    receive_count = default_registry.max_receive_count(fifo=settings.queue.endswith(".fifo"))
    created = ensure_queues(client, settings.queue, max_receive_count=receive_count)
    if settings.idempotency_table:
        await _ensure_table(connection, settings.idempotency_table)
    companions: list[Companion] = []
    if receivers is not None:
        wire_recipes(connection, queue=settings.queue, table=settings.idempotency_table, receivers=receivers)
        companions.append(receivers.serve)
    recipes_note = recipes_banner(receivers, demo=demo)
    schedules_note = "no schedules file (set WORKER_SCHEDULES_FILE)"
    if settings.schedules_file:
        companions.append(_scheduler(connection, settings.schedules_file, created.queue_url))
        schedules_note = f"firing the schedules of {settings.schedules_file} on time"
    companions.append(_dashboard(settings))
    print(
        f"""
sqs-worker dev: local AWS at {connection.endpoint_url}
  queue {created.queue_url}
  DLQ   {created.dlq_url}
  {schedules_note}
  {recipes_note}
{banner(settings)}
Stop with Ctrl-C.
""",
        file=sys.stderr,
        flush=True,
    )
    if demo:
        jobs = [Job(job_type, payload, key) for job_type, payload, key in DEMO_JOBS]
        jobs += demo_jobs(receivers) if receivers is not None else []
        await asyncio.to_thread(enqueue_many, client, created.queue_url, jobs)
    await serve(settings, default_registry, companions=companions)
    return 0


def recipes_banner(receivers: Receivers | None, *, demo: bool) -> str:
    """The banner's recipes line; it names the demo's report only when the demo jobs are sent (not --no-demo)."""
    if receivers is None:
        return "recipes: off (they need the idempotency table and the [dev] extra's aiosmtpd and aiosmtplib)"
    note = (
        f"recipes: SMTP receiver at 127.0.0.1:{receivers.smtp_port}, webhook receiver at {receivers.webhook_url}"
        f" (secret {DEV_WEBHOOK_SECRET}), reports in s3://{DEV_BUCKET}"
    )
    return note + ("; demo report: sqs-worker status report-demo" if demo else "")


def _recipe_receivers(settings: WorkerSettings) -> Receivers | None:
    """The recipes' local receivers, when the recipes can run here (a table, and the [dev] extra's packages)."""
    import importlib.util

    if not settings.idempotency_table:
        return None
    if any(importlib.util.find_spec(name) is None for name in ("aiosmtpd", "aiosmtplib")):
        return None
    return Receivers()


def exports(settings: WorkerSettings) -> dict[str, str]:
    """The variables another shell needs to reach this dev server: with them, every command of the README and
    plain boto3 work there."""
    connection = settings.aws()
    variables = {
        "AWS_ENDPOINT_URL": connection.endpoint_url or "",
        "AWS_REGION": connection.region,
        "AWS_DEFAULT_REGION": connection.region,  # boto3 reads this one, not AWS_REGION
        "AWS_ACCESS_KEY_ID": connection.access_key_id or DEV_KEY,
        "AWS_SECRET_ACCESS_KEY": connection.secret_access_key or DEV_KEY,
        "WORKER_QUEUE": settings.queue,
    }
    if settings.idempotency_table:
        variables["WORKER_IDEMPOTENCY_TABLE"] = settings.idempotency_table
    if settings.schedules_file:
        variables["WORKER_SCHEDULES_FILE"] = str(Path(settings.schedules_file).resolve())
    return variables


def banner(settings: WorkerSettings) -> str:
    """How to use this dev server from another shell: the exports, then an enqueue to paste."""
    lines = ["Use it from another shell (sqs-worker's commands and plain boto3 work with these variables):"]
    script = Path(sys.executable).with_name("sqs-worker")
    on_path = shutil.which("sqs-worker")
    if script.is_file() and (on_path is None or Path(on_path).resolve() != script.resolve()):
        lines.append(f'  export PATH={shlex.quote(str(script.parent))}:"$PATH"')
    pairs = [f"{name}={shlex.quote(value)}" for name, value in exports(settings).items()]
    rows = [pairs[index : index + 3] for index in range(0, len(pairs), 3)]
    lines.append("  export " + " \\\n    ".join(" ".join(row) for row in rows))
    lines.append("""  sqs-worker enqueue send_email --payload '{"to": "you@example.com", "subject": "Hi"}'""")
    return "\n".join(lines)


async def _ensure_table(connection: AwsConnection, name: str) -> None:
    from worker.backends.aws import async_client
    from worker.idempotency import create_table

    async with async_client("dynamodb", connection=connection.client_kwargs()) as client:
        await create_table(client, name)


def _dashboard(settings: WorkerSettings) -> Companion:
    """The web dashboard beside the worker, actions enabled (a local sandbox); its URL printed once it listens."""

    async def companion(stop: asyncio.Event) -> None:
        from worker.dashboard.config import DashboardSettings
        from worker.dashboard.serve import serve_dashboard
        from worker.errors import ConfigError

        values = {"dashboard_actions": True, **settings.model_dump(exclude_unset=False)}
        dash = load_settings(DashboardSettings, **values).with_aws(settings.aws())

        def listening(url: str) -> None:
            print(f"sqs-worker dev: dashboard at {url}", file=sys.stderr, flush=True)

        try:
            try:
                await serve_dashboard(dash, stop=stop, on_listening=listening, handle_signals=False)
            except ConfigError as exc:
                if "cannot listen" not in str(exc):
                    raise
                dash = dash.model_copy(update={"dashboard_port": 0})
                await serve_dashboard(dash, stop=stop, on_listening=listening, handle_signals=False)
        except ConfigError as exc:
            print(f"sqs-worker dev: no dashboard: {exc}", file=sys.stderr, flush=True)

    return companion


def _scheduler(connection: AwsConnection, path: str, queue_url: str) -> Companion:
    from worker.scheduling.schedules import Schedule, load_schedules, run_local_scheduler

    schedules = load_schedules(path)

    async def companion(stop: asyncio.Event) -> None:
        from worker.backends.aws import async_client

        async with async_client("sqs", connection=connection.client_kwargs()) as client:

            async def send_body(body: str, schedule: Schedule) -> None:
                kwargs: dict[str, str] = {}
                if queue_url.endswith(".fifo"):
                    kwargs["MessageGroupId"] = schedule.name
                    kwargs["MessageDeduplicationId"] = hashlib.sha256(body.encode()).hexdigest()
                await client.send_message(QueueUrl=queue_url, MessageBody=body, **kwargs)

            await run_local_scheduler(schedules, send_body, stop)

    return companion
