"""The recipes in ``sqs-worker dev``: a local SMTP receiver and a webhook receiver on loopback ports, the recipes
wired to them (and to the embedded S3), and one demo job of each. What the receivers get is printed."""

from __future__ import annotations

import asyncio
import logging
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from worker.dev.localaws import free_port

if TYPE_CHECKING:
    from worker.producer import Job
    from worker.settings import AwsConnection

DEV_WEBHOOK_SECRET = "dev-webhook-secret"  # noqa: S105 (a local demo secret, printed in the banner)
DEV_BUCKET = "sqs-worker-dev-reports"
TEMPLATES = """\
welcome:
  version: 1
  subject: "Welcome, $name"
  body: |
    Hello $name, this mail came through sqs-worker's email recipe.
"""


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class Receivers:
    """The two local receivers: ports, and the webhook deliveries seen (the first of each id answers 503)."""

    smtp_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    seen: set[str] = field(default_factory=set)

    @property
    def webhook_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/hooks"

    async def serve(self, stop: asyncio.Event) -> None:
        """Run both receivers until ``stop`` (a companion of the worker)."""
        from aiohttp import web
        from aiosmtpd.smtp import SMTP

        logging.getLogger("mail.log").setLevel(logging.WARNING)  # aiosmtpd logs every SMTP command at INFO
        loop = asyncio.get_running_loop()
        smtp = await loop.create_server(lambda: SMTP(_MailPrinter()), "127.0.0.1", self.smtp_port)
        app = web.Application()
        app.router.add_post("/hooks", self._webhook)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.http_port).start()
        try:
            await stop.wait()
        finally:
            smtp.close()
            await runner.cleanup()

    async def _webhook(self, request: Any) -> Any:
        from aiohttp import web

        from worker.recipes.webhook import SignatureInvalid, verify

        body = await request.read()
        delivery = request.headers.get("Webhook-Id", "?")
        try:
            verify(DEV_WEBHOOK_SECRET, body, dict(request.headers))
            check = "signature ok"
        except SignatureInvalid as exc:
            check = f"signature REFUSED ({exc})"
        if delivery not in self.seen:
            self.seen.add(delivery)
            say(f"dev webhook receiver: {delivery} {check}; answering 503 once to show a retry")
            return web.Response(status=503, headers={"Retry-After": "1"})
        say(f"dev webhook receiver: {delivery} {check}: {body.decode(errors='replace')}")
        return web.Response(status=204)


class _MailPrinter:
    def __init__(self) -> None:
        self.count = 0

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        from email import message_from_bytes

        self.count += 1
        mail = message_from_bytes(envelope.content)
        say(
            f"dev smtp receiver: mail to {', '.join(envelope.rcpt_tos)}, subject {mail['Subject']!r}, "
            f"template {mail['X-Template']}, queued as DEV{self.count:04d}"
        )
        return f"250 2.0.0 Ok: queued as DEV{self.count:04d}"


def wire_recipes(connection: AwsConnection, *, queue: str, table: str | None, receivers: Receivers) -> None:
    """Point the recipes at the receivers and the embedded AWS (never through the process environment)."""
    from worker.backends.aws import sync_client
    from worker.recipes import email, report, webhook

    folder = Path(tempfile.mkdtemp(prefix="sqs-worker-dev-"))
    (folder / "templates.yaml").write_text(TEMPLATES, encoding="utf-8")
    webhook.configure(webhook.WebhookSettings(secret=SecretStr(DEV_WEBHOOK_SECRET), timeout_s=5))
    email.configure(
        email.EmailSettings(
            sender="dev@sqs-worker.local",
            templates=folder / "templates.yaml",
            smtp_host="127.0.0.1",
            smtp_port=receivers.smtp_port,
        )
    )
    kwargs = connection.client_kwargs()
    sync_client("s3", connection=kwargs).create_bucket(Bucket=DEV_BUCKET)
    report.configure(
        report.Wiring(settings=report.ReportSettings(bucket=DEV_BUCKET), connection=kwargs, queue=queue, table=table)
    )


def demo_jobs(receivers: Receivers) -> list[Job]:
    from worker.producer import Job

    return [
        Job("webhook", {"url": receivers.webhook_url, "event": "order.paid", "data": {"order": 1001}, "id": "demo-1"}),
        Job("email", {"to": "ada@example.com", "template": "welcome", "event": "demo", "variables": {"name": "Ada"}}),
        Job("report", {"report_id": "demo", "source": "numbers", "rows": 30, "chunk_rows": 10}),
    ]


RECIPE_MODULES = ["worker.recipes.webhook", "worker.recipes.email", "worker.recipes.report"]
