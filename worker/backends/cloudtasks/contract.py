"""The HTTP contract between Cloud Tasks and ``serve-tasks`` (pure): what a request says, what an answer means.

Cloud Tasks POSTs the task's body (our envelope) with headers naming the task and counting its dispatches, and
retries any non-2xx answer by the queue's retry config. So: 2xx = done (success, duplicate, or dead-lettered by
the worker itself), 500 = retry with the queue's backoff, 429 + ``Retry-After`` = retry after the handler's
``RetryableError(delay_s=...)``, 503 + ``Retry-After`` = not run now (over capacity, shutting down, idempotency
lease held elsewhere, ledger unreachable), 401 = unauthenticated (nothing ran).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from worker.jobs import JobSpec

TASK_NAME = "x-cloudtasks-taskname"
QUEUE_NAME = "x-cloudtasks-queuename"
RETRY_COUNT = "x-cloudtasks-taskretrycount"
EXECUTION_COUNT = "x-cloudtasks-taskexecutioncount"
#: Cloud Tasks' largest task (body, headers and the rest).
MAX_TASK_BYTES = 1_048_576
#: Room for a task's own fields (name, URL, headers: the requeue audit too) within MAX_TASK_BYTES.
TASK_OVERHEAD_BYTES = 16 * 1024
#: The largest body a task this worker creates may carry: the producer refuses more, and serve-tasks answers 413
#: above it, so whatever it accepted (and dead-lettered) ``dlq requeue`` / ``redrive`` can send again.
MAX_TASK_BODY_BYTES = MAX_TASK_BYTES - TASK_OVERHEAD_BYTES
#: Of that overhead, what headers of the caller's own (a requeue's audit) may take: the rest is the task's URL,
#: token config, name and schedule.
MAX_EXTRA_HEADER_BYTES = 4 * 1024
#: Cloud Tasks' longest dispatch deadline for HTTP targets.
MAX_DISPATCH_DEADLINE_S = 1800


@dataclass(frozen=True)
class TaskRequest:
    """One delivery of a task."""

    body: bytes
    task_name: str
    queue_name: str
    retry_count: int = 0
    execution_count: int = 0

    @property
    def attempt(self) -> int:
        """This delivery's attempt, 1-based: the dispatches before it (X-CloudTasks-TaskRetryCount) plus one."""
        return self.retry_count + 1


#: A count header longer than this is not a count Cloud Tasks sends (nor one int() may take: 4,300 digits at most).
MAX_COUNT_DIGITS = 10


def _count(text: str | None) -> int:
    """A retry or execution count header: plain ASCII digits, else 0 (``"²".isdigit()`` is true, ``int`` refuses it)."""
    digits = (text or "").strip()
    if not digits or len(digits) > MAX_COUNT_DIGITS or not (digits.isascii() and digits.isdigit()):
        return 0
    return min(int(digits), 10**9)


def parse_request(body: bytes, headers: Mapping[str, str], *, default_queue: str) -> TaskRequest:
    """The task a request carries (header names lower-case). A request without Cloud Tasks' headers (a local call
    with the shared secret) is a first attempt of a task named ``local-<random>``."""
    name = (headers.get(TASK_NAME) or "").strip()[:500] or f"local-{uuid.uuid4().hex}"
    queue = (headers.get(QUEUE_NAME) or "").strip().rsplit("/", 1)[-1][:100] or default_queue
    return TaskRequest(
        body=body,
        task_name=name,
        queue_name=queue,
        retry_count=_count(headers.get(RETRY_COUNT)),
        execution_count=_count(headers.get(EXECUTION_COUNT)),
    )


def effective_max_attempts(*, job_max_attempts: int, queue_max_attempts: int) -> int:
    """A job gets the fewer of its own ``max_attempts`` and the queue's ``maxAttempts``: Cloud Tasks drops a task
    after the queue's last attempt, so the worker must dead-letter it then at the latest."""
    return max(1, min(job_max_attempts, queue_max_attempts))


def is_last_attempt(attempt: int, *, max_attempts: int) -> bool:
    return attempt >= max_attempts


@dataclass(frozen=True)
class Reply:
    """The answer to one delivery."""

    status: int
    outcome: str  # succeeded, duplicate, dead_lettered, retry, retry_after, busy, over_capacity, unauthorized ...
    retry_after_s: int | None = None
    detail: str | None = None

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}

    def body(self) -> dict[str, object]:
        document: dict[str, object] = {"outcome": self.outcome}
        if self.detail:
            document["detail"] = self.detail
        if self.retry_after_s is not None:
            document["retry_after_s"] = self.retry_after_s
        return document


def done(outcome: str, detail: str | None = None) -> Reply:
    """2xx: Cloud Tasks deletes the task."""
    return Reply(200, outcome, detail=detail)


def retry(detail: str, *, delay_s: float | None = None) -> Reply:
    """Ask for another attempt: 500 (the queue's backoff), or 429 with Retry-After when the handler named a delay."""
    if delay_s is None:
        return Reply(500, "retry", detail=detail)
    return Reply(429, "retry_after", retry_after_s=max(1, math.ceil(delay_s)), detail=detail)


def not_now(outcome: str, *, retry_after_s: float, detail: str | None = None) -> Reply:
    """503 with Retry-After: the job did not run (it is not its failure; Cloud Tasks counts an attempt all the same)."""
    return Reply(503, outcome, retry_after_s=max(1, math.ceil(retry_after_s)), detail=detail)


def queue_retry_config(specs: Iterable[JobSpec]) -> dict[str, object]:
    """The queue's retry config for these jobs (``gcloud tasks queues create/update`` flags, pure).

    Cloud Tasks, not the worker, waits between attempts: min backoff = the smallest ``backoff_base_s``, max backoff
    = the largest ``backoff_max_s``, doubling (``max-doublings`` so the base reaches the cap); max attempts = the
    largest ``max_attempts`` (the worker dead-letters each job at its own ``max_attempts``, at the latest at the
    queue's). Cloud Tasks waits the full delay (no 50-100% jitter as on SQS).
    """
    jobs = list(specs)
    if not jobs:
        raise ValueError("no jobs")
    base_s = max(0.1, min(spec.backoff_base_s for spec in jobs))
    cap_s = max(base_s, max(spec.backoff_max_s for spec in jobs))
    doublings = max(0, math.ceil(math.log2(cap_s / base_s))) if cap_s > base_s else 0
    return {
        "max-attempts": max(spec.max_attempts for spec in jobs),
        "min-backoff": f"{base_s:g}s",
        "max-backoff": f"{cap_s:g}s",
        "max-doublings": doublings,
        "max-retry-duration": "0s",
    }


def deadline_warnings(specs: Iterable[JobSpec], dispatch_deadline_s: int) -> list[str]:
    """What ``serve-tasks`` warns about at start: jobs whose ``timeout_s`` reaches the tasks' dispatch deadline
    (Cloud Tasks stops waiting for the answer then and retries the task while it still runs)."""
    warnings = []
    over_cap = [spec for spec in specs if spec.timeout_s > MAX_DISPATCH_DEADLINE_S]
    if over_cap:
        warnings.append(
            f"job(s) {_timeouts(over_cap)} have timeout_s above Cloud Tasks' {MAX_DISPATCH_DEADLINE_S} s (30-minute) "
            "dispatch deadline: Cloud Tasks gives up on them earlier and retries while they still run"
        )
    reached = [spec for spec in specs if dispatch_deadline_s <= spec.timeout_s <= MAX_DISPATCH_DEADLINE_S]
    if reached:
        warnings.append(
            f"job(s) {_timeouts(reached)} have timeout_s at or above WORKER_CLOUDTASKS_DISPATCH_DEADLINE_S="
            f"{dispatch_deadline_s}: Cloud Tasks stops waiting after {dispatch_deadline_s} s and retries while they "
            f"still run; set it above the largest timeout_s (at most {MAX_DISPATCH_DEADLINE_S})"
        )
    return warnings


def flow_warnings(specs: Iterable[JobSpec]) -> list[str]:
    """What ``serve-tasks`` warns about at start: jobs with a ``rate_limit`` or a ``breaker``, which it does not
    apply (each delivery runs as it comes); the queue's own limits do that job on Cloud Tasks."""
    gated = [spec for spec in specs if spec.rate is not None or spec.breaker is not None]
    if not gated:
        return []

    def which(spec: JobSpec) -> str:
        return " and ".join(word for word, on in (("rate_limit", spec.rate), ("breaker", spec.breaker)) if on)

    named = ", ".join(f"{spec.name} ({which(spec)})" for spec in gated)
    return [
        f"job(s) {named}: serve-tasks does not apply rate_limit or breaker (each delivery runs as it comes); "
        "limit the queue itself: gcloud tasks queues update QUEUE --max-dispatches-per-second=N "
        "--max-concurrent-dispatches=N"
    ]


def _timeouts(specs: Iterable[JobSpec]) -> str:
    return ", ".join(f"{spec.name} (timeout_s {spec.timeout_s:g})" for spec in specs)
