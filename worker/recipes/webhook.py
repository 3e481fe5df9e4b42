"""Webhook delivery: a signed HTTP POST, retried the way receivers expect. Enable it with
``WORKER_HANDLERS=worker.recipes.webhook`` and ``WORKER_WEBHOOK_SECRET``; copy it to make your own.

Job type ``webhook``, payload ``{"url": ..., "event": "order.paid", "data": {...}, "id": "optional"}``. The
request body is ``{"id", "event", "data"}`` as compact JSON, with these headers:

- ``Webhook-Id``: the delivery id (the payload's ``id``, else the job's idempotency key); the same on every retry,
  so a receiver can drop a repeat.
- ``Webhook-Timestamp``: Unix seconds when this attempt was signed.
- ``Webhook-Signature``: ``v1=<hex HMAC-SHA256 of "<timestamp>.<body>" keyed with the secret>``.

Outcomes: 2xx succeeds (the status is the job's result); 408, 429, 5xx, timeouts and connection errors are
retried, after ``Retry-After`` when the receiver sends one (seconds or an HTTP date, capped by
``WORKER_WEBHOOK_MAX_RETRY_AFTER_S``); any other status is permanent (dead-lettered). Receivers check a request
with ``verify``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from worker.context import JobContext
from worker.errors import PermanentError, RetryableError, WorkerError
from worker.flow import Breaker
from worker.jobs import Registry, default_registry

log = logging.getLogger("worker")

JOB_TYPE = "webhook"
SIGNATURE_VERSION = "v1"
RETRY_STATUSES = frozenset({408, 429})


class WebhookSettings(BaseSettings):
    """``WORKER_WEBHOOK_*`` variables (or ``.env`` lines)."""

    model_config = SettingsConfigDict(env_prefix="WORKER_WEBHOOK_", env_file=".env", extra="ignore")

    secret: SecretStr | None = None
    timeout_s: float = Field(default=10.0, gt=0)
    max_retry_after_s: int = Field(default=3600, ge=0)
    #: Starts per endpoint host across the fleet ("600/m"; "off": none). Read when the job is registered.
    rate_limit: str = "600/m"
    #: The circuit breaker per endpoint host: this many counted failures within the window open it for the cool-down.
    breaker_failures: int = Field(default=10, ge=1)
    breaker_window_s: float = Field(default=60.0, gt=0)
    breaker_cooldown_s: float = Field(default=60.0, gt=0)


_configured: WebhookSettings | None = None


def configure(settings: WebhookSettings | None) -> None:
    """Use ``settings`` instead of the ``WORKER_WEBHOOK_*`` variables (``sqs-worker dev`` does; None: read them)."""
    global _configured
    _configured = settings


class Webhook(BaseModel):
    """The payload of a ``webhook`` job."""

    url: str = Field(pattern=r"^https?://")
    event: str = Field(min_length=1, max_length=200)
    data: dict[str, Any] = Field(default_factory=dict)
    id: str | None = Field(default=None, min_length=1, max_length=200)


class SignatureInvalid(WorkerError):
    """A webhook request whose signature, timestamp or headers do not verify."""


# ----------------------------------------------------------------------------------------------- signing (pure)


def sign(secret: str, *, timestamp: int, body: bytes) -> str:
    """The ``Webhook-Signature`` header value for ``body`` sent at ``timestamp``."""
    digest = hmac.new(secret.encode("utf-8"), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"{SIGNATURE_VERSION}={digest}"


def verify(
    secret: str, body: bytes, headers: Mapping[str, str], *, tolerance_s: int = 300, now_s: float | None = None
) -> None:
    """For receivers: raise SignatureInvalid unless ``headers`` sign ``body`` (the raw request body) with
    ``secret`` within ``tolerance_s`` of now (the replay window). Header names are matched case-insensitively;
    several space-separated signatures (during a secret rotation) are accepted if any matches."""
    lower = {name.lower(): value for name, value in headers.items()}
    try:
        timestamp = int(lower["webhook-timestamp"])
        signatures = lower["webhook-signature"].split()
    except (KeyError, ValueError):
        raise SignatureInvalid("missing or malformed Webhook-Timestamp / Webhook-Signature") from None
    now = time.time() if now_s is None else now_s
    if abs(now - timestamp) > tolerance_s:
        raise SignatureInvalid(f"timestamp outside the {tolerance_s} s replay window")
    expected = sign(secret, timestamp=timestamp, body=body)
    if not any(hmac.compare_digest(expected, candidate) for candidate in signatures):
        raise SignatureInvalid("signature does not match")


def retry_after_s(value: str | None, *, now: datetime, cap_s: int) -> int | None:
    """Seconds a ``Retry-After`` header asks for (delta-seconds or an HTTP date), capped; None when absent or
    unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(int(value), cap_s)
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return min(max(0, int((moment - now).total_seconds() + 0.999)), cap_s)


def judge(status: int, *, retry_after: str | None, now: datetime, cap_s: int) -> None:
    """Nothing for 2xx; RetryableError for 408, 429 and 5xx (after Retry-After); PermanentError otherwise."""
    if 200 <= status < 300:
        return
    if status in RETRY_STATUSES or status >= 500:
        raise RetryableError(
            f"receiver answered HTTP {status}", delay_s=retry_after_s(retry_after, now=now, cap_s=cap_s)
        )
    raise PermanentError(f"receiver answered HTTP {status}")


# ----------------------------------------------------------------------------------------------- the job


def request_body(payload: Webhook, delivery_id: str) -> bytes:
    document = {"id": delivery_id, "event": payload.event, "data": payload.data}
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


async def deliver(payload: Webhook, ctx: JobContext) -> dict[str, Any]:
    """POST one signed delivery; the outcome follows ``judge``."""
    settings = _configured or WebhookSettings()
    problem = missing_setting(settings)
    if problem is not None or settings.secret is None:
        raise PermanentError(problem or "no secret")
    delivery_id = payload.id or ctx.idempotency_key or ctx.message_id
    body = request_body(payload, delivery_id)
    timestamp = int(time.time())
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "sqs-worker-webhook",
        "Webhook-Id": delivery_id,
        "Webhook-Event": payload.event,
        "Webhook-Timestamp": str(timestamp),
        # Several space-separated secrets (a rotation): one signature each, the receiver's verify takes any.
        "Webhook-Signature": " ".join(
            sign(secret, timestamp=timestamp, body=body) for secret in settings.secret.get_secret_value().split()
        ),
    }
    timeout = aiohttp.ClientTimeout(total=min(settings.timeout_s, max(0.1, ctx.time_left_s())))
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.post(payload.url, data=body, headers=headers, allow_redirects=False) as response,
        ):
            status, retry_after = response.status, response.headers.get("Retry-After")
    except TimeoutError:
        raise RetryableError(f"receiver did not answer within {timeout.total:g} s") from None
    except aiohttp.ClientError as exc:
        raise RetryableError(f"could not reach the receiver: {type(exc).__name__}: {exc}") from None
    judge(status, retry_after=retry_after, now=datetime.now(UTC), cap_s=settings.max_retry_after_s)
    ctx.logger.info("webhook delivered", extra={"status": status, "delivery_id": delivery_id})
    return {"status": status, "delivery_id": delivery_id, "attempt": ctx.attempt}


def delivery_key(payload: Webhook) -> str:
    """The idempotency key: the payload's id, else a hash of url, event and data (same delivery, same key)."""
    if payload.id:
        return payload.id
    text = json.dumps([payload.url, payload.event, payload.data], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


#: The job's options; ``register(registry, **options)`` overrides any of them.
JOB_OPTIONS: dict[str, Any] = {"max_attempts": 8, "timeout_s": 60, "backoff_base_s": 5, "backoff_max_s": 900}


def endpoint_host(payload: Webhook) -> str:
    """The rate limit's and the circuit breaker's key: the endpoint's host (and port)."""
    return urlsplit(payload.url).netloc.lower() or payload.url


def flow_options(settings: WebhookSettings) -> dict[str, Any]:
    """A rate limit and a circuit breaker per endpoint host, from ``WORKER_WEBHOOK_*``."""
    options: dict[str, Any] = {
        "breaker": Breaker(
            key=endpoint_host,
            failures=settings.breaker_failures,
            window_s=settings.breaker_window_s,
            cooldown_s=settings.breaker_cooldown_s,
        )
    }
    if settings.rate_limit.strip().lower() != "off":
        options.update(rate_limit=settings.rate_limit, rate_key=endpoint_host)
    return options


def missing_setting(settings: WebhookSettings) -> str | None:
    """What keeps every delivery from being sent (each is then dead-lettered as permanent), or None."""
    if settings.secret is None or not settings.secret.get_secret_value().split():
        return "WORKER_WEBHOOK_SECRET is not set: webhooks are never sent unsigned"
    return None


async def warn_unconfigured() -> AsyncIterator[None]:
    """At the start of a worker that runs the ``webhook`` job: a warning when a missing setting would dead-letter
    every delivery (not an error: a worker whose handlers import ``verify`` has the job without sending any)."""
    problem = missing_setting(_configured or WebhookSettings())
    if problem is not None:
        log.warning("job %r: %s; each of its jobs is dead-lettered (permanent) until it is set", JOB_TYPE, problem)
    yield


def register(registry: Registry, **options: Any) -> None:
    """Register the ``webhook`` job on ``registry`` (done on import for the default one)."""
    flow = flow_options(_configured or WebhookSettings())
    registry.job(JOB_TYPE, key=delivery_key, **{**JOB_OPTIONS, **flow, **options})(deliver)
    registry.lifespan(warn_unconfigured)


register(default_registry)
