"""Exceptions raised by sqs-worker and by handlers to steer it.

The tree::

    WorkerError                      root of everything sqs-worker raises
    ├── ConfigError                  a missing or wrong setting; stops the start with one line
    ├── QueueUnavailable             the SQS endpoint cannot be reached or keeps failing
    ├── LedgerUnavailable            the idempotency table cannot be reached (fail closed)
    ├── InvalidMessage               a message that is not a valid envelope (carries its category)
    ├── JobTimeout                   the job's ``timeout_s`` ran out (also a TimeoutError); retried
    ├── HandlerExit                  a handler or middleware raised a BaseException that is no Exception
    │                                (SystemExit, pytest.fail's): the job's failure, retried; never the worker's exit
    └── JobError                     raised by handlers to say what to do with the job
        ├── PermanentError           never retried: dead-lettered at once as ``permanent``
        └── RetryableError           retried, optionally after ``delay_s`` (for example a Retry-After)
"""

from __future__ import annotations

import asyncio
import math
from types import TracebackType


class WorkerError(Exception):
    """Root of every exception sqs-worker raises."""


class ConfigError(WorkerError):
    """A setting is missing or wrong. The message is one line meant for a human."""


class QueueUnavailable(WorkerError):
    """The queue endpoint refused, timed out, throttled or answered 5xx."""


class LedgerUnavailable(WorkerError):
    """The idempotency table could not be read or written; no handler runs without its guard."""


class InvalidMessage(WorkerError):
    """A message body that is not a valid envelope.

    ``category`` is the dead-letter category: ``invalid_message``, ``unknown_type`` or ``invalid_payload``;
    ``job_type`` the registered job type whose payload was refused (None when no registered type is known).
    """

    def __init__(self, category: str, message: str, *, job_type: str | None = None) -> None:
        super().__init__(message)
        self.category = category
        self.job_type = job_type


class HandlerExit(WorkerError):
    """A handler or middleware raised a BaseException that is no Exception (SystemExit, KeyboardInterrupt,
    GeneratorExit, a test framework's failure such as ``pytest.fail``, a library's own): the job's failure
    (retried like any other exception), never the worker's exit. ``error`` is what was raised."""

    def __init__(self, error: BaseException, *, source: str = "handler") -> None:
        super().__init__(f"{type(error).__name__} raised by the {source}")
        self.error = error
        self.source = source


class FailsTheJob:
    """``with FailsTheJob(source):`` around a handler's or middleware's run: a BaseException that is no Exception
    (nor ``asyncio.CancelledError``, the worker's own cancellation) leaves as HandlerExit, the job's failure."""

    def __init__(self, source: str = "handler") -> None:
        self.source = source

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None or isinstance(exc, Exception | asyncio.CancelledError):
            return
        raise HandlerExit(exc, source=self.source) from exc


class JobTimeout(WorkerError, TimeoutError):
    """The worker's own timeout for a handler fired: the job ran longer than its ``timeout_s`` (a TimeoutError
    a handler raises itself, a downstream call's, keeps its own type and text)."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"the handler ran longer than timeout_s={timeout_s:g}")
        self.timeout_s = timeout_s


class JobError(WorkerError):
    """Base of the exceptions a handler raises on purpose."""


class PermanentError(JobError):
    """The job can never succeed: dead-letter it now, without retrying."""


class RetryableError(JobError):
    """The job failed for a passing reason: retry it, after ``delay_s`` seconds if given."""

    def __init__(self, message: str = "", *, delay_s: float | None = None) -> None:
        super().__init__(message)
        if delay_s is not None and not (math.isfinite(delay_s) and delay_s >= 0):
            raise ValueError(f"delay_s must be a finite number >= 0, not {delay_s!r}")
        self.delay_s = delay_s
