"""sqs-worker: background jobs on AWS SQS.

Register handlers with ``@job``; raise ``PermanentError`` or ``RetryableError`` to steer retries.
"""

from worker.context import JobContext
from worker.errors import (
    ConfigError,
    HandlerExit,
    InvalidMessage,
    JobError,
    JobTimeout,
    LedgerUnavailable,
    PermanentError,
    QueueUnavailable,
    RetryableError,
    WorkerError,
)
from worker.flow import Breaker
from worker.jobs import JobSpec, Registry, default_registry, job, lifespan, middleware
from worker.lifecycle import Resources
from worker.middleware import CallNext

__all__ = [
    "Breaker",
    "CallNext",
    "ConfigError",
    "HandlerExit",
    "InvalidMessage",
    "JobContext",
    "JobError",
    "JobSpec",
    "JobTimeout",
    "LedgerUnavailable",
    "PermanentError",
    "QueueUnavailable",
    "Registry",
    "Resources",
    "RetryableError",
    "WorkerError",
    "default_registry",
    "job",
    "lifespan",
    "middleware",
]
