"""The AWS edge, shared by the worker (aiobotocore) and the CLI (boto3): clients, the error table, queue URLs.

A flat module for now; /work/shared/LAYOUT.md moves it to ``worker/backends/sqs.py`` (with ``sqs.py``) later.

- Clients: :func:`client_config` (the worker's, async) and :func:`sync_client` / :func:`async_client` (the CLI's)
  are built from one set of options: the region from the settings, endpoint and credentials from the standard AWS
  variables (botocore reads them), timeouts and botocore's attempts from ``worker.budgets``.
- Errors: :func:`classify` sorts any botocore, aiohttp or socket error into one :class:`Trouble`; :func:`translate`
  turns it into the ``worker.errors`` tree with one short line that names the endpoint, the queue or table, or
  the error code (an HTML error page becomes ``HTTP 500 (Internal Server Error)``, never the page):

  ============  ======================================================  =====================================
  Trouble       raised by                                               becomes
  ============  ======================================================  =====================================
  UNREACHABLE   connection refused or dropped, timeouts                 QueueUnavailable / LedgerUnavailable
  TRANSIENT     throttling, HTTP 5xx and 429, ExpiredToken              QueueUnavailable / LedgerUnavailable
  CREDENTIALS   no credentials, InvalidClientTokenId, bad signature     ConfigError
  ACCESS        AccessDenied and kin                                    ConfigError
  MISSING       no such queue (or table)                                ConfigError
  REFUSED       any other 4xx (a request the endpoint will not take)    QueueUnavailable / LedgerUnavailable
  ============  ======================================================  =====================================

- Queue URLs: :func:`resolve_queue_url` (async) and :func:`resolve_queue_url_sync` follow one rule: a URL is used
  as given, a name is looked up with GetQueueUrl.
- :func:`call_with_budget`: one call of the worker retried as a ``worker.budgets`` budget allows.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    HTTPClientError,
    NoCredentialsError,
    ParamValidationError,
    PartialCredentialsError,
    ReadTimeoutError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from worker.budgets import CLI_BOTOCORE_ATTEMPTS, WORKER_BOTOCORE_ATTEMPTS, Budget, botocore_retries, retry_delay_s
from worker.errors import ConfigError, LedgerUnavailable, QueueUnavailable, WorkerError
from worker.names import queue_name_of

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    from aiobotocore.config import AioConfig
    from types_aiobotocore_sqs import SQSClient as AsyncSQSClient

    from worker.settings import WorkerSettings

T = TypeVar("T")

#: Seconds to open a connection; a read waits longer (a long poll holds the request up to 20 s).
CONNECT_TIMEOUT_S = 3
#: The worker's read timeout is the long poll's wait plus this: a stalled connection frees its loop soon after.
READ_TIMEOUT_MARGIN_S = 5
#: Read timeout of the CLI's calls.
CLI_READ_TIMEOUT_S = 30
#: Longest error text kept from an endpoint's answer (one short line).
MAX_DETAIL_CHARS = 200


class Trouble(StrEnum):
    UNREACHABLE = "unreachable"
    TRANSIENT = "transient"
    CREDENTIALS = "credentials"
    ACCESS = "access"
    MISSING = "missing"
    REFUSED = "refused"


TRANSIENT_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "RequestThrottledException",
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "ServiceUnavailable",
        "InternalError",
        "InternalFailure",
        "InternalServerError",
        "KMS.ThrottlingException",
        "RequestTimeout",
        "SlowDown",
        "ExpiredToken",  # temporary credentials: botocore refreshes them before the next call
        "ExpiredTokenException",
    }
)
CREDENTIAL_CODES = frozenset(
    {
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "SignatureDoesNotMatch",
        "IncompleteSignature",
        "InvalidSignatureException",
        "MissingAuthenticationToken",
        "MissingAuthenticationTokenException",
        "InvalidAccessKeyId",
        "AuthFailure",
        "InvalidSecurity",
    }
)
ACCESS_CODES = frozenset(
    {"AccessDenied", "AccessDeniedException", "AuthorizationError", "KMS.AccessDeniedException", "OptInRequired"}
)
MISSING_CODES = frozenset(
    {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist", "NonExistentQueue", "ResourceNotFoundException"}
)
_UNREACHABLE_ERRORS: tuple[type[BaseException], ...] = (
    BotoConnectionError,  # EndpointConnectionError, ConnectTimeoutError, ConnectionClosedError, ProxyConnectionError
    HTTPClientError,
    ReadTimeoutError,
    OSError,  # ConnectionRefusedError, ConnectionResetError, socket.timeout
    asyncio.TimeoutError,
)
SERVICE_NAMES = {"sqs": "SQS", "dynamodb": "DynamoDB", "cloudwatch": "CloudWatch"}

#: Codes with which SQS refuses a message's content (characters, size, attributes), not the request as such.
CONTENT_REFUSED_CODES = frozenset(
    {
        "InvalidParameterValue",
        "InvalidParameterValueException",
        "InvalidMessageContents",
        "MessageTooLong",
        "InvalidAttributeValue",
        "InvalidAttributeName",
        "MessageAttributesInvalid",
    }
)


def _error(exc: ClientError) -> tuple[str, str, int]:
    error = exc.response.get("Error", {})
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return str(error.get("Code", "") or ""), str(error.get("Message", "") or ""), status


def classify(exc: BaseException) -> Trouble:
    """Which kind of trouble an exception from a botocore/aiobotocore call is (pure)."""
    if isinstance(exc, ClientError):
        code, _, status = _error(exc)
        if code in MISSING_CODES:
            return Trouble.MISSING
        if code in CREDENTIAL_CODES:
            return Trouble.CREDENTIALS
        if code in ACCESS_CODES:
            return Trouble.ACCESS
        if code in TRANSIENT_CODES or status >= 500 or status == 429:
            return Trouble.TRANSIENT
        return Trouble.REFUSED
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return Trouble.CREDENTIALS
    if isinstance(exc, _UNREACHABLE_ERRORS):
        return Trouble.UNREACHABLE
    try:
        import aiohttp
    except ImportError:  # pragma: no cover - aiohttp comes with aiobotocore
        return Trouble.REFUSED
    if isinstance(exc, aiohttp.ClientError):
        return Trouble.UNREACHABLE
    return Trouble.REFUSED


def content_refused(exc: BaseException) -> bool:
    """Whether SQS (or botocore, before sending) refused a message's content rather than failing the call; a
    translated error (``QueueUnavailable``) is judged by its cause."""
    cause = exc.__cause__ if isinstance(exc, QueueUnavailable) else exc
    if isinstance(cause, ClientError):
        return _error(cause)[0] in CONTENT_REFUSED_CODES
    return isinstance(cause, ParamValidationError | UnicodeError)


def is_transient(exc: BaseException) -> bool:
    """True when the same request may succeed later (the endpoint is unwell, not the request wrong)."""
    return classify(exc) in (Trouble.UNREACHABLE, Trouble.TRANSIENT)


_TITLE = re.compile(r"<title>\s*(.*?)\s*</title>", re.IGNORECASE | re.DOTALL)


def one_line(text: str, limit: int = MAX_DETAIL_CHARS) -> str:
    """``text`` on one line (whitespace runs collapsed), at most ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _page_summary(message: str, status: int) -> str | None:
    """``HTTP 500 (Internal Server Error)`` for an HTML or other non-AWS error page, else None."""
    head = message.lstrip()[:200].lower()
    if not (head.startswith("<") and ("html" in head or "<title" in head or "<h1" in head)):
        return None
    match = _TITLE.search(message)
    title = one_line(match.group(1), 80) if match else "an error page, not an AWS answer"
    title = re.sub(rf"^{status}\s+", "", title) if status else title
    return f"HTTP {status or '?'} ({title})"


def describe(exc: BaseException) -> str:
    """One short line for any error of the edge: the code and message, never a whole error page."""
    if isinstance(exc, ClientError):
        code, message, status = _error(exc)
        page = _page_summary(message, status)
        if page is not None:
            return page
        if not code or code == str(status):
            return one_line(f"HTTP {status} ({message})" if message else f"HTTP {status}")
        return one_line(f"{code}: {message}" if message else code)
    if isinstance(exc, EndpointConnectionError):
        return f"cannot connect to {exc.kwargs.get('endpoint_url', 'the endpoint')}"
    text = str(exc) or type(exc).__name__
    return one_line(text if isinstance(exc, BotoCoreError) else f"{type(exc).__name__}: {text}")


def _reason(exc: BaseException) -> str:
    """Why a connection failed, in a few words."""
    cause = getattr(exc, "kwargs", {}).get("error") if isinstance(getattr(exc, "kwargs", None), dict) else None
    text = f"{exc} {cause or ''} {exc.__cause__ or ''}".lower()
    if "refused" in text or isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if "timeout" in text or "timed out" in text or isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, EndpointConnectionError):
        return "cannot connect"
    return describe(exc)


def endpoint_of(exc: BaseException) -> str | None:
    """The endpoint URL a botocore error names, if any."""
    kwargs = getattr(exc, "kwargs", None)
    if isinstance(kwargs, dict):
        url = kwargs.get("endpoint_url")
        if isinstance(url, str) and url:
            return url.rstrip("/")
    return None


def client_endpoint(client: Any) -> str | None:
    """The endpoint URL a client calls (None for a client that has none, such as the memory backend's)."""
    url = getattr(getattr(client, "meta", None), "endpoint_url", None)
    return url if isinstance(url, str) else None


def table_unavailable(exc: BaseException, action: str, *, table: str, client: Any) -> LedgerUnavailable:
    """A running ledger's failed call (idempotency or workflow table): always LedgerUnavailable (fail closed),
    worded as ``translate`` words it, naming the table and the client's endpoint."""
    error = translate(exc, action, service="dynamodb", resource=table, endpoint=client_endpoint(client))
    return error if isinstance(error, LedgerUnavailable) else LedgerUnavailable(str(error))


def translate(
    exc: BaseException, action: str, *, service: str = "sqs", resource: str | None = None, endpoint: str | None = None
) -> WorkerError:
    """The ``worker.errors`` exception for a failed call: one line naming what is wrong (pure).

    ``action`` names the call (``GetQueueUrl``); ``resource`` the queue or table; ``endpoint`` the URL called
    (taken from the error when it names one).
    """
    name = SERVICE_NAMES.get(service, service)
    trouble = classify(exc)
    where = endpoint_of(exc) or endpoint
    detail = describe(exc)
    if trouble is Trouble.MISSING:
        if service == "dynamodb":
            what = f"idempotency table {resource!r}" if resource else "the idempotency table"
            return ConfigError(
                f"{action}: {what} does not exist: run `sqs-worker bootstrap` or fix WORKER_IDEMPOTENCY_TABLE"
            )
        what = f"queue {resource!r}" if resource else "the queue"
        at = f" at {where}" if where else ""
        return ConfigError(f"{action}: {what} does not exist{at}: run `sqs-worker bootstrap` or check its name")
    if trouble is Trouble.CREDENTIALS:
        return ConfigError(
            f"{action}: {name} refused the credentials ({detail}): check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "or AWS_PROFILE"
        )
    if trouble is Trouble.ACCESS:
        on = f" on {resource!r}" if resource else ""
        return ConfigError(f"{action}: access denied{on} ({detail}): the credentials lack the IAM permission")
    unavailable = LedgerUnavailable if service == "dynamodb" else QueueUnavailable
    if trouble is Trouble.UNREACHABLE:
        at = f" at {where}" if where else ""
        return unavailable(
            f"{action}: cannot reach {name}{at} ({_reason(exc)}): check AWS_ENDPOINT_URL and the network"
        )
    verb = "refused" if trouble is Trouble.REFUSED else "failed"
    if _is_page(exc):  # a web server, not AWS, answered: say which, and where to look
        at = f" from {where}" if where else ""
        return unavailable(f"{action} {verb}: {detail}{at}, a web page, not an AWS answer: check AWS_ENDPOINT_URL")
    return unavailable(f"{action} {verb}: {detail}")


def _is_page(exc: BaseException) -> bool:
    """Whether a failed call's answer was an HTML page (a web server or proxy answered, not AWS)."""
    if not isinstance(exc, ClientError):
        return False
    _, message, status = _error(exc)
    return _page_summary(message, status) is not None


# ------------------------------------------------------------------------------------------------- clients


def _options(*, read_timeout_s: float, attempts: int, pool: int) -> dict[str, Any]:
    return {
        "connect_timeout": CONNECT_TIMEOUT_S,
        "read_timeout": read_timeout_s,
        "retries": botocore_retries(attempts),
        "max_pool_connections": pool,
    }


def client_config(settings: WorkerSettings, *, validate: bool = True) -> AioConfig:
    """The worker's aiobotocore config: one botocore attempt per call (the worker's budgets retry), a read
    timeout above the long poll, a connection per receive loop plus room for batches and the ledger.

    ``validate=False`` (the worker's SQS client) skips botocore's check of each call's parameters against the
    API model, about 3% of a no-op job's CPU: the worker builds every SQS call itself, and SQS still refuses a
    bad one (``translate`` reads its answer as it reads every refusal)."""
    from aiobotocore.config import AioConfig

    from worker.runtime.slots import receive_loops

    return AioConfig(
        parameter_validation=validate,
        **_options(
            read_timeout_s=settings.poll_wait_s + READ_TIMEOUT_MARGIN_S,
            attempts=WORKER_BOTOCORE_ATTEMPTS,
            pool=receive_loops(settings.concurrency) + 16,
        ),
    )


def cli_options(*, read_timeout_s: float = CLI_READ_TIMEOUT_S) -> dict[str, Any]:
    """The CLI's client options: botocore tries each call CLI_BOTOCORE_ATTEMPTS times, nothing retries above it."""
    return _options(read_timeout_s=read_timeout_s, attempts=CLI_BOTOCORE_ATTEMPTS, pool=10)


def sync_client(
    service: str, *, read_timeout_s: float = CLI_READ_TIMEOUT_S, connection: Mapping[str, Any] | None = None
) -> Any:
    """A blocking boto3 client with the CLI's options: region from the settings, endpoint and credentials from
    botocore, unless ``connection`` (``WorkerSettings.aws().client_kwargs()``) says where, as for ``async_client``."""
    import boto3
    from botocore.config import Config

    create: Any = boto3.client  # the service is a runtime value: no overload of the stubs applies
    return create(service, config=Config(**cli_options(read_timeout_s=read_timeout_s)), **_where(connection))


def _where(connection: Mapping[str, Any] | None) -> dict[str, Any]:
    from worker.settings import aws_region

    return dict(connection) if connection is not None else {"region_name": aws_region()}


def async_client(
    service: str, *, config: AioConfig | None = None, connection: Mapping[str, Any] | None = None
) -> AbstractAsyncContextManager[Any]:
    """An aiobotocore client (``async with``); the CLI's options unless ``config`` (the worker's) is given.
    ``connection`` (``WorkerSettings.aws().client_kwargs()``: region, and the endpoint and keys ``sqs-worker dev``
    sets) wins over the region of the AWS variables."""
    from aiobotocore.config import AioConfig
    from aiobotocore.session import get_session

    create: Any = get_session().create_client  # the service is a runtime value: no overload of the stubs applies
    manager: AbstractAsyncContextManager[Any] = create(
        service, config=config or AioConfig(**cli_options()), **_where(connection)
    )
    return manager


# ------------------------------------------------------------------------------------------------- queue URLs


def given_url(queue: str) -> str | None:
    """``queue`` when it is a URL (used as given), None when it is a name to look up (pure)."""
    return queue if queue.startswith(("https://", "http://")) else None


async def resolve_queue_url(client: AsyncSQSClient, queue: str) -> str:
    """A queue URL from a name or URL (a URL is returned unchanged)."""
    url = given_url(queue)
    if url is not None:
        return url
    try:
        response = await client.get_queue_url(QueueName=queue_name_of(queue))
    except Exception as exc:
        raise translate(exc, "GetQueueUrl", resource=queue, endpoint=client.meta.endpoint_url) from exc
    return response["QueueUrl"]


def resolve_queue_url_sync(client: Any, queue: str) -> str:
    """:func:`resolve_queue_url` for a blocking boto3 client."""
    url = given_url(queue)
    if url is not None:
        return url
    try:
        response = client.get_queue_url(QueueName=queue_name_of(queue))
    except Exception as exc:
        raise translate(exc, "GetQueueUrl", resource=queue, endpoint=client.meta.endpoint_url) from exc
    found: str = response["QueueUrl"]
    return found


# ------------------------------------------------------------------------------------------------- retrying


async def call_with_budget(
    call: Callable[[], Awaitable[T]],
    *,
    budget: Budget,
    rng: random.Random | None = None,
    monotonic: Callable[[], float] = time.monotonic,
    retryable: Callable[[BaseException], bool] = is_transient,
) -> T:
    """Await ``call()`` (one raw client call), retrying failures ``retryable`` accepts (transient ones) as
    ``budget`` allows. The last error is raised as ``call`` raised it: the caller translates it (with the queue
    or table it concerns)."""
    started = monotonic()
    failures = 0
    while True:
        try:
            return await call()
        except Exception as exc:
            if not retryable(exc):
                raise
            failures += 1
            delay_s = retry_delay_s(
                budget=budget, failures=failures, elapsed_s=monotonic() - started, jitter=(rng or random).random()
            )
            if delay_s is None:
                raise
            await asyncio.sleep(delay_s)  # backoff between transport retries, bounded by the budget


# ------------------------------------------------------------------------------------------------- per-call cost


def freeze_user_agent(client: Any) -> None:
    """Build the client's User-Agent header once instead of twice per request.

    botocore renders the header when it builds each request and again, through a ``request-created`` handler, to
    add the per-request feature ids (retry mode, ...) of its usage telemetry: about a tenth of the client's CPU per
    SQS call on the worker's hot path. After this, every request carries the header as rendered now (without those
    per-request ids). Does nothing when the client does not have botocore's usual shape, or was frozen before.
    """
    creator = getattr(client, "_user_agent_creator", None)
    meta = getattr(client, "meta", None)
    if creator is None or meta is None or getattr(creator, "_sqs_worker_frozen", False):
        return
    try:
        header = creator.to_string()
        service_id = meta.service_model.service_id.hyphenize()
        meta.events.unregister(f"request-created.{service_id}", creator.rebuild_and_replace_user_agent_handler)
    except Exception:  # an optimisation only: any other botocore shape keeps its default behaviour
        return
    creator.to_string = lambda: header
    creator._sqs_worker_frozen = True
