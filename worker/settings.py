"""The worker's configuration: one pydantic-settings class, read from ``WORKER_*`` variables and ``.env``.

Endpoint and credentials come from the standard AWS variables (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ...), which botocore reads itself from the process environment (not from ``.env``);
the region from ``AWS_REGION`` or ``AWS_DEFAULT_REGION`` (AwsSettings, the process environment too, so the
worker and botocore agree). Only ``sqs-worker dev`` names an endpoint and credentials explicitly
(``WorkerSettings.with_aws``): nothing in the package reads or writes ``os.environ`` but this module.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Self, TypeVar, overload

from pydantic import AliasChoices, Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from worker.errors import ConfigError
from worker.flow.priorities import Mode, QueueSpec, parse_queue_set

#: The characters of a CloudWatch namespace.
_NAMESPACE = re.compile(r"[0-9A-Za-z._/#: -]+")


@dataclass(frozen=True)
class AwsConnection:
    """Where and as whom the AWS clients connect. ``None`` leaves a value to botocore's own lookup
    (``AWS_ENDPOINT_URL``/``AWS_ENDPOINT_URL_SQS``..., the credentials chain)."""

    region: str
    endpoint_url: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for the clients of ``worker.backends.aws`` (``connection=``)."""
        kwargs: dict[str, Any] = {"region_name": self.region}
        if self.endpoint_url is not None:
            kwargs["endpoint_url"] = self.endpoint_url
        if self.access_key_id is not None:
            kwargs["aws_access_key_id"] = self.access_key_id
            kwargs["aws_secret_access_key"] = self.secret_access_key
        return kwargs


class AwsSettings(BaseSettings):
    """The AWS region, from ``AWS_REGION`` or ``AWS_DEFAULT_REGION`` (in that order) of the process environment.
    Not from ``.env``: botocore reads the AWS variables from the environment only, and the worker must agree with it.
    """

    model_config = SettingsConfigDict(extra="ignore", env_ignore_empty=True)

    region: str | None = Field(default=None, validation_alias=AliasChoices("AWS_REGION", "AWS_DEFAULT_REGION"))


class WorkerSettings(BaseSettings):
    """Everything the worker reads from its environment."""

    model_config = SettingsConfigDict(env_prefix="WORKER_", env_file=".env", extra="ignore")

    queue: str = Field(
        description="Queue name or URL to consume; with WORKER_QUEUES, the first of the set (set one or the other)."
    )
    backend: Literal["sqs", "cloudtasks"] = Field(
        default="sqs", description="sqs, or cloudtasks (Google Cloud Tasks; its settings are WORKER_CLOUDTASKS_*)."
    )
    queues: Annotated[tuple[QueueSpec, ...], NoDecode] = Field(
        default=(),
        description="Several queues, highest priority first, each with its own DLQ: 'critical:10,default:3,bulk:1'.",
    )
    queues_mode: Mode = Field(
        default=Mode.WEIGHTED,
        description="How WORKER_QUEUES share slots: 'weighted' (by weight) or 'strict' (a lower queue only when "
        "every higher one is empty).",
    )
    dead_letter_queue: str | None = Field(
        default=None, description="DLQ name or URL; default: the queue's redrive target, else '<queue>-dlq'."
    )
    handlers: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Comma-separated importable modules that register handlers with @job."
    )
    concurrency: int = Field(default=10, ge=1, le=1000, description="Jobs running at once.")
    prefetch: int = Field(
        default=0,
        ge=0,
        le=1000,
        description="Messages held beyond the concurrency, received ahead so a job starts as soon as one ends.",
    )
    processes: str = Field(
        default="1",
        pattern=r"^(auto|[1-9][0-9]{0,2})$",
        description="Worker processes under one supervisor (each runs `concurrency` jobs); auto: the usable cores.",
    )
    visibility_timeout_s: int = Field(
        default=30, ge=5, le=43_200, description="Claim length; heartbeats extend it while a job runs."
    )
    shutdown_grace_s: float = Field(
        default=30.0, ge=0, allow_inf_nan=False, description="Time running jobs get to finish on SIGTERM."
    )
    poll_wait_s: int = Field(default=20, ge=0, le=20, description="Long-polling wait of each ReceiveMessage.")
    start_timeout_s: float = Field(
        default=60.0,
        gt=0,
        allow_inf_nan=False,
        description="How long `run` keeps trying to reach SQS at start before it exits 2.",
    )
    max_receive_count: int | None = Field(
        default=None, ge=1, le=1000, description="Redrive maxReceiveCount for bootstrap; default: max_attempts + 2."
    )
    idempotency_table: str | None = Field(default=None, description="DynamoDB table for idempotency keys.")
    metrics_namespace: str = Field(
        default="SqsWorker",
        description="CloudWatch namespace of the worker's metrics (letters, digits, . - _ / # : and spaces; not AWS/).",
    )
    metrics: Literal["emf", "cloudwatch", "off"] = Field(
        default="emf", description="emf: Embedded Metric Format lines on stdout; cloudwatch: batched PutMetricData."
    )
    prometheus_port: int | None = Field(default=None, ge=0, le=65_535, description="Serve /metrics on this port.")
    event_loop: Literal["asyncio", "uvloop"] = Field(
        default="asyncio", description="The event loop of `run`: asyncio's own, or uvloop (the `uvloop` extra)."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["json", "text"] = "json"
    redact_fields: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["password", "secret", "token", "authorization", "api_key"],
        description="Comma-separated field names whose values are redacted wherever they appear in logs.",
    )
    health_port: int | None = Field(default=None, ge=0, le=65_535, description="Serve /healthz and /readyz here.")
    listen_host: str = Field(
        default="0.0.0.0",  # noqa: S104 - probes and scrapes come from outside the container  # nosec B104
        min_length=1,
        description="The address the health and /metrics ports listen on (a supervisor's processes: 127.0.0.1).",
    )
    health_file: str = Field(
        default="/tmp/sqs-worker-health",  # noqa: S108 - a liveness timestamp, not a secret; overridable  # nosec B108
        description="File the running worker touches each loop turn; `sqs-worker health --check` reads it.",
    )
    health_max_age_s: float = Field(
        default=60.0, gt=0, allow_inf_nan=False, description="Older liveness than this is unhealthy."
    )
    schedules_file: str | None = Field(default=None, description="Path of the schedules YAML file (cron jobs).")

    @field_validator("handlers", "redact_fields", mode="before")
    @classmethod
    def _split_handlers(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @model_validator(mode="before")
    @classmethod
    def _one_queue_setting(cls, data: Any) -> Any:
        """WORKER_QUEUE or WORKER_QUEUES, not both; with WORKER_QUEUES, ``queue`` is its first queue."""
        if not isinstance(data, dict):
            return data
        given = data.get("queues")
        if isinstance(given, str):
            if not given.strip():
                data = {key: value for key, value in data.items() if key != "queues"}
                given = None
            else:
                try:
                    given = parse_queue_set(given)
                except ValueError as exc:
                    raise ValueError(f"WORKER_QUEUES {exc}") from None
                data = {**data, "queues": given}
        if not given:
            return data
        if data.get("queue"):
            raise ValueError("set WORKER_QUEUE (one queue) or WORKER_QUEUES (several), not both")
        if data.get("dead_letter_queue"):
            raise ValueError(
                "WORKER_DEAD_LETTER_QUEUE does not go with WORKER_QUEUES: each queue of the set has its own DLQ "
                "(its redrive target, else <queue>-dlq)"
            )
        return {**data, "queue": given[0].queue}

    def queue_set(self) -> tuple[QueueSpec, ...]:
        """The queues to consume, highest priority first: WORKER_QUEUES, else WORKER_QUEUE alone (weight 1)."""
        return self.queues or (QueueSpec(self.queue),)

    @field_validator("metrics_namespace")
    @classmethod
    def _cloudwatch_namespace(cls, value: str) -> str:
        """As CloudWatch takes it: 1-255 of its characters, not only spaces, not AWS's own (``AWS/``)."""
        if not value.strip() or len(value) > 255 or not _NAMESPACE.fullmatch(value) or value.startswith(("AWS/", ":")):
            raise ValueError(
                "a CloudWatch namespace is 1-255 ASCII letters, digits, spaces and . - _ / # :, not only spaces, "
                "and starts with neither AWS/ nor ':'"
            )
        return value

    @field_validator("queue")
    @classmethod
    def _queue_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value.strip()

    _aws: AwsConnection | None = PrivateAttr(default=None)

    def aws(self) -> AwsConnection:
        """Where the AWS clients connect: what ``with_aws`` set, else the region of the AWS variables."""
        return self._aws or AwsConnection(region=aws_region())

    def with_aws(self, connection: AwsConnection) -> Self:
        """A copy whose clients connect as ``connection`` says (``sqs-worker dev``: its embedded endpoint)."""
        copy = self.model_copy()
        copy._aws = connection
        return copy


def aws_region() -> str:
    """The region from ``AWS_REGION`` or ``AWS_DEFAULT_REGION``; a ConfigError when neither is set."""
    region = AwsSettings().region
    if not region:
        raise ConfigError("no AWS region: set AWS_REGION (or AWS_DEFAULT_REGION), for example AWS_REGION=eu-west-1")
    return region


def child_environment(**overrides: str) -> dict[str, str]:
    """This process's environment with ``overrides``: what a worker process the supervisor starts inherits."""
    return {**os.environ, **overrides}


def botocore_endpoint_variables() -> tuple[str | None, str | None]:
    """``AWS_ENDPOINT_URL`` and ``AWS_ENDPOINT_URL_SQS`` as botocore reads them itself (a cache key for clients)."""
    return os.environ.get("AWS_ENDPOINT_URL"), os.environ.get("AWS_ENDPOINT_URL_SQS")


S = TypeVar("S", bound=WorkerSettings)


@overload
def load_settings(settings_class: None = None, **overrides: object) -> WorkerSettings: ...
@overload
def load_settings(settings_class: type[S], **overrides: object) -> S: ...


def load_settings(settings_class: type[WorkerSettings] | None = None, **overrides: object) -> WorkerSettings:
    """Read the settings (``WorkerSettings`` or a subclass with other defaults), turning validation errors into
    one ConfigError line; warns on stderr about ``AWS_*`` variables in ``.env``, which are not read from there."""
    try:
        settings = (settings_class or WorkerSettings)(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc)) from exc
    dotenv = read_dotenv(Path(".env"))
    unread = sorted(name for name in dotenv.values if name.startswith("AWS_") and name not in os.environ)
    if unread:
        print(
            f"sqs-worker: warning: .env sets {', '.join(unread)}, not read from there: AWS variables come from the "
            "process environment only (as botocore reads them); export them: set -a; . ./.env; set +a",
            file=sys.stderr,
        )
    overridden = sorted(
        name
        for name, value in dotenv.values.items()
        if name.startswith("AWS_") and name in os.environ and os.environ[name] != (value or "")
    )
    if overridden:  # names only: a value may be a secret key
        print(
            f"sqs-worker: warning: .env sets {', '.join(overridden)} to another value than the environment's, which "
            "is the one used: AWS variables come from the process environment only (as botocore reads them)",
            file=sys.stderr,
        )
    return settings


@dataclass(frozen=True)
class Dotenv:
    """A ``.env`` file as python-dotenv (and so pydantic-settings) reads it: its values, and the lines it skips
    (each run of them as its first and last line: a quote left open swallows every line after it)."""

    values: dict[str, str | None]
    unparsed_lines: tuple[tuple[int, int], ...] = ()


def read_dotenv(path: Path) -> Dotenv:
    if not path.is_file():
        return Dotenv({})
    from dotenv.parser import parse_stream

    values: dict[str, str | None] = {}
    unparsed: list[tuple[int, int]] = []
    with path.open(encoding="utf-8", errors="replace") as stream:
        for binding in parse_stream(stream):
            if binding.error:
                first = binding.original.line
                unparsed.append((first, first + binding.original.string.rstrip("\n").count("\n")))
            elif binding.key is not None:
                values[binding.key] = binding.value
    return Dotenv(values, tuple(unparsed))


#: Families not judged: each recipe's settings class lives in the recipe's module, which registers its job when
#: imported. (The dashboard's ``WORKER_DASHBOARD_*`` and Cloud Tasks' ``WORKER_CLOUDTASKS_*`` are judged by their
#: classes: the command line passes their names.)
UNJUDGED_FAMILIES = ("WORKER_WEBHOOK_", "WORKER_EMAIL_", "WORKER_REPORT_")


def unknown_variables(names: Iterable[str], known: Iterable[str]) -> list[str]:
    """Each ``WORKER_*`` name of ``names`` that no settings class of ``known`` reads (a recipe's family is not
    judged), with the setting it most likely misspells (pure)."""
    known = sorted(known)
    found = []
    for name in sorted(set(names)):
        if not name.startswith("WORKER_") or name in known or name.startswith(UNJUDGED_FAMILIES):
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        found.append(f"{name} (did you mean {close[0]}?)" if close else name)
    return found


def variable_names(settings_class: type[BaseSettings]) -> list[str]:
    """The environment variables ``settings_class`` reads (its prefix and each field, upper case)."""
    prefix = str(settings_class.model_config.get("env_prefix", ""))
    return [f"{prefix}{field}".upper() for field in settings_class.model_fields]


#: Tells a process the supervisor started its index in the group (logs; not a setting); it leaves warnings to the
#: supervisor.
PROCESS_INDEX_ENV = "SQS_WORKER_PROCESS_INDEX"


def supervised() -> bool:
    """Whether this process is one the supervisor started (``WORKER_PROCESSES`` above 1)."""
    return PROCESS_INDEX_ENV in os.environ


def variable_warnings(*settings_classes: type[BaseSettings]) -> list[str]:
    """What the command line warns about at start: the ``.env`` lines that do not parse (python-dotenv, and so
    pydantic-settings, skips them), and the ``WORKER_*`` variables (environment or ``.env``) that neither
    ``WorkerSettings`` nor ``settings_classes`` read. None in a process the supervisor started: it warned
    already."""
    if supervised():
        return []
    dotenv = read_dotenv(Path(".env"))
    warnings = []
    if dotenv.unparsed_lines:
        lines = ", ".join(str(first) if first == last else f"{first}-{last}" for first, last in dotenv.unparsed_lines)
        hint = "" if all(first == last for first, last in dotenv.unparsed_lines) else "; is a quote left open?"
        warnings.append(f".env line(s) {lines} do not parse (KEY=value{hint}): skipped")
    classes: tuple[type[BaseSettings], ...] = (WorkerSettings, *settings_classes)
    known = [name for cls in classes for name in variable_names(cls)]
    unknown = unknown_variables([*os.environ, *dotenv.values], known)
    if unknown:
        warnings.append(f"not a setting, ignored: {', '.join(unknown)}")
    return warnings


def describe_validation_error(exc: ValidationError) -> str:
    """One line naming each bad setting by its environment variable."""
    parts = []
    for error in exc.errors():
        field = ".".join(str(loc) for loc in error["loc"])
        variable = f"WORKER_{field.upper()}"
        if not field:  # a check of several settings together: its message names them
            parts.append(str(error["msg"]).removeprefix("Value error, "))
        elif error["type"] == "missing" and field == "queue":
            parts.append("WORKER_QUEUE is not set (or WORKER_QUEUES, for several queues)")
        elif error["type"] == "missing":
            parts.append(f"{variable} is not set")
        else:
            parts.append(f"{variable}: {str(error['msg']).removeprefix('Value error, ')}")
    return "invalid settings: " + "; ".join(parts)
