"""Templated email over SMTP (aiosmtplib), sent once per recipient, template and event. Enable it with
``WORKER_HANDLERS=worker.recipes.email``, ``WORKER_EMAIL_SENDER`` and ``WORKER_EMAIL_TEMPLATES``; copy it to make
your own.

Job type ``email``, payload ``{"to": ..., "template": "welcome", "event": "signup:42", "variables": {...}}``.
Templates live in one YAML file, ``name: {version, subject, body}``, with ``$name`` placeholders
(``string.Template``); a missing variable is permanent. The idempotency key is ``email:<to>:<template>:<event>``,
so a retry, a duplicate delivery or a second enqueue of the same event never sends twice (the message's
``Message-ID`` is derived from that key too, for providers that deduplicate by it).

Outcomes: the server's answer to DATA (``250 ... queued as ID``) is kept in the ledger as the job's result with
the template's name and version. 4xx answers, connection failures and timeouts are retried; 5xx answers (recipient
refused, sender refused, authentication failed) are permanent (dead-lettered).
"""

from __future__ import annotations

import hashlib
import logging
import re
import string
from collections.abc import AsyncIterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from worker.context import JobContext
from worker.errors import PermanentError, RetryableError
from worker.jobs import Registry, default_registry

log = logging.getLogger("worker")

JOB_TYPE = "email"
_QUEUED_AS = re.compile(r"queued as\s+(\S+)", re.IGNORECASE)


class EmailSettings(BaseSettings):
    """``WORKER_EMAIL_*`` variables (or ``.env`` lines)."""

    model_config = SettingsConfigDict(env_prefix="WORKER_EMAIL_", env_file=".env", extra="ignore")

    sender: str | None = None
    templates: Path | None = None
    smtp_host: str = "localhost"
    smtp_port: int = Field(default=587, ge=1, le=65535)
    smtp_username: str | None = None
    smtp_password: SecretStr | None = None
    smtp_starttls: bool = False
    smtp_tls: bool = False
    timeout_s: float = Field(default=30.0, gt=0)


_configured: EmailSettings | None = None


def configure(settings: EmailSettings | None) -> None:
    """Use ``settings`` instead of the ``WORKER_EMAIL_*`` variables (``sqs-worker dev`` does; None: read them)."""
    global _configured
    _configured = settings


class Email(BaseModel):
    """The payload of an ``email`` job."""

    to: str = Field(pattern=r"^[^@\s]+@[^@\s]+$", max_length=320)
    template: str = Field(min_length=1, max_length=100)
    event: str = Field(min_length=1, max_length=200, description="What this mail is about: one mail per event.")
    variables: dict[str, Any] = Field(default_factory=dict)


class Template(BaseModel):
    """One template: its version is recorded with every mail sent from it."""

    version: int | str = 1
    subject: str
    body: str


class Rendered(BaseModel):
    subject: str
    body: str
    template: str
    version: str


# ----------------------------------------------------------------------------------------------- pure parts


def load_templates(path: Path) -> dict[str, Template]:
    import yaml

    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise PermanentError(f"{path}: templates are a mapping of name to version, subject and body")
    return {str(name): Template.model_validate(value) for name, value in data.items()}


def render(templates: dict[str, Template], name: str, variables: dict[str, Any]) -> Rendered:
    """Subject and body with ``variables`` filled in; PermanentError for an unknown template or variable."""
    template = templates.get(name)
    if template is None:
        raise PermanentError(f"no email template {name!r}")
    try:
        subject = string.Template(template.subject).substitute(variables)
        body = string.Template(template.body).substitute(variables)
    except KeyError as exc:
        raise PermanentError(f"email template {name!r} needs variable {exc.args[0]!r}") from None
    except ValueError as exc:
        raise PermanentError(f"email template {name!r} is malformed: {exc}") from None
    return Rendered(subject=subject, body=body, template=name, version=str(template.version))


def mail_key(payload: Email) -> str:
    return f"{payload.to}:{payload.template}:{payload.event}"


def message_id(key: str, sender: str) -> str:
    domain = sender.rsplit("@", 1)[-1] or "sqs-worker"
    return f"<{hashlib.sha256(key.encode('utf-8')).hexdigest()[:32]}@{domain}>"


def smtp_failure(code: int, text: str) -> Exception:
    """RetryableError for a temporary (4xx) answer, PermanentError for a permanent one (5xx and the rest)."""
    if 400 <= code < 500:
        return RetryableError(f"SMTP {code}: {text}")
    return PermanentError(f"SMTP {code}: {text}")


def provider_id(response: str) -> str:
    """The provider's id of an accepted message: ``queued as ID`` in the DATA answer, else the whole answer."""
    found = _QUEUED_AS.search(response)
    return found.group(1) if found else response.strip()


# ----------------------------------------------------------------------------------------------- the job


async def send_email(payload: Email, ctx: JobContext) -> dict[str, Any]:
    import aiosmtplib

    settings = _configured or EmailSettings()
    problem = missing_setting(settings)
    if problem is not None or not settings.sender or settings.templates is None:
        raise PermanentError(problem or "no sender or templates")
    rendered = render(load_templates(settings.templates), payload.template, payload.variables)
    message = EmailMessage()
    try:
        message["From"] = settings.sender
        message["To"] = payload.to
        message["Subject"] = rendered.subject
        message["Message-ID"] = message_id(ctx.idempotency_key or mail_key(payload), settings.sender)
        message["X-Template"] = f"{rendered.template}/{rendered.version}"
        message.set_content(rendered.body)
    except ValueError as exc:  # a line break in a header (a variable carrying "\r\nBcc: ..."): never sendable
        raise PermanentError(f"the message cannot be built: {exc}") from None
    try:
        _, response = await aiosmtplib.send(
            message,
            hostname=settings.smtp_host,
            port=settings.smtp_port,
            username=settings.smtp_username,
            password=settings.smtp_password.get_secret_value() if settings.smtp_password else None,
            start_tls=settings.smtp_starttls,
            use_tls=settings.smtp_tls,
            timeout=min(settings.timeout_s, max(1.0, ctx.time_left_s())),
        )
    except aiosmtplib.SMTPRecipientsRefused as exc:
        first = exc.recipients[0]
        raise smtp_failure(first.code, first.message) from None
    except aiosmtplib.SMTPResponseException as exc:
        raise smtp_failure(exc.code, exc.message) from None
    except aiosmtplib.SMTPNotSupported as exc:  # e.g. a non-ASCII address and a server without SMTPUTF8
        raise PermanentError(f"the SMTP server cannot take this message: {exc}") from None
    except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
        raise RetryableError(f"SMTP server unreachable: {type(exc).__name__}: {exc}") from None
    ctx.logger.info("email sent", extra={"template": rendered.template, "template_version": rendered.version})
    return {
        "provider_id": provider_id(response),
        "response": response,
        "message_id": message["Message-ID"],
        "template": rendered.template,
        "version": rendered.version,
    }


#: The job's options; ``register(registry, **options)`` overrides any of them.
JOB_OPTIONS: dict[str, Any] = {"max_attempts": 8, "timeout_s": 60, "backoff_base_s": 10, "backoff_max_s": 900}


def missing_setting(settings: EmailSettings) -> str | None:
    """What keeps every email from being sent (each is then dead-lettered as permanent), or None."""
    if not settings.sender or settings.templates is None:
        return "set WORKER_EMAIL_SENDER and WORKER_EMAIL_TEMPLATES to send email"
    return None


async def warn_unconfigured() -> AsyncIterator[None]:
    """At the start of a worker that runs the ``email`` job: a warning when a missing setting would dead-letter
    every email (not an error: the job is registered wherever the module is imported)."""
    problem = missing_setting(_configured or EmailSettings())
    if problem is not None:
        log.warning("job %r: %s; each of its jobs is dead-lettered (permanent) until they are set", JOB_TYPE, problem)
    yield


def register(registry: Registry, **options: Any) -> None:
    """Register the ``email`` job on ``registry`` (done on import for the default one)."""
    registry.job(JOB_TYPE, key=mail_key, **{**JOB_OPTIONS, **options})(send_email)
    registry.lifespan(warn_unconfigured)


register(default_registry)
