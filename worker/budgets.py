"""Transport retry budgets (pure): how long each AWS call is tried after transport failures, and what then.

A transport failure is one the same request may survive: connection refused or dropped, a timeout, throttling,
HTTP 5xx (``worker.backends.aws.is_transient`` decides). Each call is retried by exactly one layer:

- in the worker, botocore makes one attempt per call (``WORKER_BOTOCORE_ATTEMPTS``) and the worker retries by the
  budgets below (its receive loop, its delete/visibility batches, ``worker.backends.aws.call_with_budget``);
- the CLI has no retry loop of its own: botocore's standard mode tries each call ``CLI_BOTOCORE_ATTEMPTS`` times.

No clocks, no clients: callers pass how many failures so far, the time spent since the first try and a jitter
draw; :func:`retry_delay_s` answers how long to wait, or that the budget is spent.
"""

from __future__ import annotations

from dataclasses import dataclass

#: botocore attempts per call in the worker: one, so no botocore retry hides under the worker's budgets.
WORKER_BOTOCORE_ATTEMPTS = 1
#: botocore attempts per call in the CLI commands (standard mode: about 1-3 s on a dead endpoint).
CLI_BOTOCORE_ATTEMPTS = 3


@dataclass(frozen=True)
class Budget:
    """How one kind of call is retried: delays from ``first_delay_s`` doubling up to ``max_delay_s``; no try
    starts later than ``give_up_after_s`` after the first (None: never give up). ``then`` says what follows."""

    calls: str
    first_delay_s: float
    max_delay_s: float
    give_up_after_s: float | None
    then: str

    def __post_init__(self) -> None:
        if self.first_delay_s < 0 or self.max_delay_s < self.first_delay_s:
            raise ValueError("need 0 <= first_delay_s <= max_delay_s")
        if self.give_up_after_s is not None and self.give_up_after_s < 0:
            raise ValueError("give_up_after_s must be >= 0 (or None: never)")


RECEIVE = Budget(
    "ReceiveMessage",
    first_delay_s=0.1,
    max_delay_s=20.0,
    give_up_after_s=None,
    then="never gives up: /readyz answers 503 and one `unreachable` line is logged until SQS answers again",
)
BATCH = Budget(
    "DeleteMessageBatch, ChangeMessageVisibilityBatch",
    first_delay_s=0.2,
    max_delay_s=5.0,
    give_up_after_s=60.0,
    then="a delete is given up (the message reappears after its visibility timeout and runs again); "
    "a visibility change is given up (the message reappears when its current visibility ends)",
)
SEND = Budget(
    "SendMessage to the dead-letter queue",
    first_delay_s=0.5,
    max_delay_s=30.0,
    give_up_after_s=None,
    then="never gives up while the worker runs: the message is kept invisible meanwhile and its handler never "
    "runs again; a send SQS refuses for its content is tried with fewer attributes",
)
HOLD_COPY = Budget(
    "SendMessage of a held job's delayed copy",
    first_delay_s=0.2,
    max_delay_s=1.0,
    give_up_after_s=3.0,
    then="the job is released in place (visibility): that receive counts toward the redrive policy's maxReceiveCount",
)
LEDGER = Budget(
    "DynamoDB (idempotency claims, completions, releases)",
    first_delay_s=0.1,
    max_delay_s=1.0,
    give_up_after_s=5.0,
    then="a claim: the message is put back for 10 s, no handler runs; a completion: logged, the job may run again; "
    "a release: the lease lapses by itself",
)
NO_RETRY = Budget("one try", first_delay_s=0.0, max_delay_s=0.0, give_up_after_s=0.0, then="the error is raised")


def start_budget(timeout_s: float) -> Budget:
    """Resolving the queue and its DLQ when ``sqs-worker run`` starts (WORKER_START_TIMEOUT_S)."""
    return Budget(
        "GetQueueUrl, GetQueueAttributes at start",
        first_delay_s=0.5,
        max_delay_s=5.0,
        give_up_after_s=timeout_s,
        then="`sqs-worker run` exits 2 with one line naming the endpoint",
    )


def retry_delay_s(*, budget: Budget, failures: int, elapsed_s: float, jitter: float) -> float | None:
    """Seconds to wait before the next try after ``failures`` (>= 1) consecutive transport failures, the first
    try having started ``elapsed_s`` ago; None when the budget is spent (give up now).

    The delay is drawn between 50% and 100% of ``min(max_delay_s, first_delay_s * 2 ** (failures - 1))`` by
    ``jitter`` in [0, 1] (so failing callers do not retry in lockstep), and shortened so that the last try
    starts at ``give_up_after_s`` at the latest.
    """
    if failures < 1:
        raise ValueError("failures counts from 1")
    if elapsed_s < 0:
        raise ValueError("elapsed_s must be >= 0")
    if not 0.0 <= jitter <= 1.0:
        raise ValueError("jitter must be within [0, 1]")
    ceiling_s = min(budget.max_delay_s, budget.first_delay_s * 2.0 ** min(failures - 1, 64))
    delay_s = ceiling_s * (0.5 + 0.5 * jitter)
    if budget.give_up_after_s is None:
        return delay_s
    remaining_s = budget.give_up_after_s - elapsed_s
    if remaining_s <= 0:
        return None
    return min(delay_s, remaining_s)


def botocore_retries(attempts: int) -> dict[str, object]:
    """botocore's ``retries`` config for ``attempts`` tries per call (standard mode)."""
    if attempts < 1:
        raise ValueError("attempts must be >= 1")
    return {"mode": "standard", "total_max_attempts": attempts}
