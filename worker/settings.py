"""The worker's configuration: one pydantic-settings class, read from ``WORKER_*`` variables and ``.env``.

Endpoint and credentials come from the standard AWS variables (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ...), which botocore reads itself; the region from ``AWS_REGION`` or
``AWS_DEFAULT_REGION``.
"""

from __future__ import annotations

import os
from typing import Annotated, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from worker.errors import ConfigError


class WorkerSettings(BaseSettings):
    """Everything the worker reads from its environment."""

    model_config = SettingsConfigDict(env_prefix="WORKER_", env_file=".env", extra="ignore")

    queue: str = Field(description="Queue name or URL to consume.")
    dead_letter_queue: str | None = Field(
        default=None, description="DLQ name or URL; default: the queue's redrive target, else '<queue>-dlq'."
    )
    handlers: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Comma-separated importable modules that register handlers with @job."
    )
    concurrency: int = Field(default=10, ge=1, le=1000, description="Jobs running at once.")
    visibility_timeout_s: int = Field(
        default=30, ge=5, le=43_200, description="Claim length; heartbeats extend it while a job runs."
    )
    shutdown_grace_s: float = Field(default=30.0, ge=0, description="Time running jobs get to finish on SIGTERM.")
    poll_wait_s: int = Field(default=20, ge=0, le=20, description="Long-polling wait of each ReceiveMessage.")
    start_timeout_s: float = Field(
        default=60.0, gt=0, description="How long `run` keeps trying to reach SQS at start before it exits 2."
    )
    max_receive_count: int | None = Field(
        default=None, ge=1, le=1000, description="Redrive maxReceiveCount for bootstrap; default: max_attempts + 2."
    )
    idempotency_table: str | None = Field(default=None, description="DynamoDB table for idempotency keys.")
    metrics_namespace: str = Field(default="SqsWorker", description="CloudWatch namespace of the worker's metrics.")
    metrics: Literal["emf", "cloudwatch", "off"] = Field(
        default="emf", description="emf: Embedded Metric Format lines on stdout; cloudwatch: batched PutMetricData."
    )
    prometheus_port: int | None = Field(default=None, ge=0, le=65_535, description="Serve /metrics on this port.")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["json", "text"] = "json"
    redact_fields: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["password", "secret", "token", "authorization", "api_key"],
        description="Comma-separated field names whose values are redacted wherever they appear in logs.",
    )
    health_port: int | None = Field(default=None, ge=0, le=65_535, description="Serve /healthz and /readyz here.")
    health_file: str = Field(
        default="/tmp/sqs-worker-health",  # noqa: S108 - a liveness timestamp, not a secret; overridable  # nosec B108
        description="File the running worker touches each loop turn; `sqs-worker health --check` reads it.",
    )
    health_max_age_s: float = Field(default=60.0, gt=0, description="Older liveness than this is unhealthy.")
    schedules_file: str | None = Field(default=None, description="Path of the schedules YAML file (cron jobs).")

    @field_validator("handlers", "redact_fields", mode="before")
    @classmethod
    def _split_handlers(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("queue")
    @classmethod
    def _queue_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value.strip()


def aws_region() -> str:
    """The region from ``AWS_REGION`` or ``AWS_DEFAULT_REGION``; a ConfigError when neither is set."""
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not region:
        raise ConfigError("no AWS region: set AWS_REGION (or AWS_DEFAULT_REGION), for example AWS_REGION=eu-west-1")
    return region


def load_settings(**overrides: object) -> WorkerSettings:
    """Read the settings, turning validation errors into one ConfigError line."""
    try:
        return WorkerSettings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc)) from exc


def describe_validation_error(exc: ValidationError) -> str:
    """One line naming each bad setting by its environment variable."""
    parts = []
    for error in exc.errors():
        field = ".".join(str(loc) for loc in error["loc"]) or "settings"
        variable = f"WORKER_{field.upper()}"
        if error["type"] == "missing":
            parts.append(f"{variable} is not set")
        else:
            parts.append(f"{variable}: {error['msg']}")
    return "invalid settings: " + "; ".join(parts)
