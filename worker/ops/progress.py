"""Pacing and progress of long dlq operations (pure): a token-bucket rate limiter and a progress line."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO


class RateLimiter:
    """A token bucket: ``acquire(n)`` waits until n more messages may go at ``rate_per_s`` (burst: one second)."""

    def __init__(
        self,
        rate_per_s: float | None,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate_per_s is not None and rate_per_s <= 0:
            raise ValueError("rate_per_s must be > 0")
        self.rate_per_s = rate_per_s
        self._monotonic = monotonic
        self._sleep = sleep
        self._capacity = max(1.0, rate_per_s or 0.0)
        self._tokens = self._capacity
        self._last = monotonic()

    def wait_s(self, count: int) -> float:
        """Seconds to wait before ``count`` messages may go (pure given the clock); reserves them."""
        if self.rate_per_s is None:
            return 0.0
        now = self._monotonic()
        self._tokens = min(self._capacity, self._tokens + (now - self._last) * self.rate_per_s)
        self._last = now
        self._tokens -= count
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate_per_s

    def acquire(self, count: int) -> None:
        delay_s = self.wait_s(count)
        if delay_s > 0:
            self._sleep(delay_s)


def render_progress(done: int, total: int | None, *, width: int = 30, failed: int = 0) -> str:
    """``[#######.......]  70/100 moved`` (pure); without a total, a count only."""
    tail = f" ({failed} failed)" if failed else ""
    if not total:
        return f"{done} moved{tail}"
    fraction = min(1.0, done / total)
    filled = round(fraction * width)
    return f"[{'#' * filled}{'.' * (width - filled)}] {done:>{len(str(total))}}/{total} moved{tail}"


class Progress:
    """A progress line on a stream: redrawn in place on a terminal, one line per ~10% otherwise."""

    def __init__(self, stream: TextIO, total: int | None) -> None:
        self.stream = stream
        self.total = total
        self._tty = bool(getattr(stream, "isatty", lambda: False)())
        self._last_decile = -1
        self._last_line: str | None = None  # the last line written (not on a terminal)

    def update(self, done: int, failed: int = 0) -> None:
        text = render_progress(done, self.total, failed=failed)
        if self._tty:
            self.stream.write("\r" + text)
        else:
            decile = int(10 * done / self.total) if self.total else done // 100
            if decile == self._last_decile:
                return
            self._last_decile = decile
            self._last_line = text
            self.stream.write(text + "\n")
        self.stream.flush()

    def finish(self, done: int, failed: int = 0) -> None:
        """The final line (not repeated when the last update wrote it already)."""
        text = render_progress(done, self.total, failed=failed)
        if not self._tty and text == self._last_line:
            return
        self.stream.write(("\r" + text if self._tty else text) + "\n")
        self.stream.flush()
