"""The clocks the runtime reads: a monotonic one for claims, heartbeats and durations, a wall clock for due times.

The runtime takes a :class:`Clock` (default: the system's). The in-memory backend's ``MemoryClock`` is one too,
so a test can run the runtime, the queue and the event loop on one clock that skips ahead.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (``time.monotonic``)."""

    def time(self) -> float:
        """Seconds since the epoch (``time.time``)."""


class SystemClock:
    """The system's clocks."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()


SYSTEM_CLOCK: Clock = SystemClock()
