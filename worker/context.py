"""What a handler may ask for besides its payload: the JobContext."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from worker.lifecycle import Resources

#: Receives progress reports; must not block (it may be called from a sync handler's thread).
ProgressSink = Callable[[float, str | None], None]


def _no_progress(percent: float, note: str | None) -> None:
    return None


@dataclass
class JobContext:
    """Facts about the running attempt. A handler gets it by taking a parameter named ``ctx``
    (or annotated ``JobContext``)."""

    job_type: str
    message_id: str
    attempt: int
    max_attempts: int
    idempotency_key: str | None
    deadline_monotonic: float
    logger: logging.LoggerAdapter[logging.Logger]
    #: Receives of the job so far, this one included (``attempt`` counts only those that ran the handler).
    receive_count: int = 0
    #: The chain or group this job is a step of (``worker.workflows``), else None.
    workflow_id: str | None = None
    #: In a chain, the previous step's result; in a group's callback, the members' results and failures.
    previous_result: Any = None
    _progress: ProgressSink = field(default=_no_progress, repr=False)
    #: What the lifespans yielded (``worker.lifecycle``): ``ctx.resources["http"]``.
    resources: Resources = field(default_factory=Resources, repr=False)

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    def time_left_s(self) -> float:
        """Seconds until the job's timeout cancels it."""
        return max(0.0, self.deadline_monotonic - time.monotonic())

    def progress(self, percent: float, note: str | None = None) -> None:
        """Record progress (0-100) and an optional note; kept in the job ledger when idempotency is on.

        Does not block: writes to the ledger are rate-limited and made in the background. Safe to call from
        a plain ``def`` handler's thread.
        """
        if not 0 <= percent <= 100:
            raise ValueError("percent must be between 0 and 100")
        self._progress(float(percent), note)

    def extra(self) -> dict[str, Any]:
        return {"job_type": self.job_type, "message_id": self.message_id, "attempt": self.attempt}
