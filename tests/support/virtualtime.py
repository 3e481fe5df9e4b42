"""Virtual time for the memory backend: the running event loop reads the broker's clock, and skips it ahead.

On moto and LocalStack a test waits in real time: a heartbeat needs its seconds, a retry its backoff. On the
memory backend nothing but the event loop can make anything happen, so when the loop would sleep until its next
timer and no event is ready, the clock jumps to that timer at once. The loop, the in-memory queue and the worker
(``Worker(clock=...)``) read one :class:`~worker.backends.memory.MemoryClock` (real time plus what was skipped),
so a visibility timeout, a heartbeat tick, a handler's ``asyncio.sleep`` and a test's ``wait_for`` all see the
same seconds, in the same order as in real time, only without the waiting.

Time never skips while something outside the loop may still act: a call in the loop's executor
(``asyncio.to_thread``), or a worker whose registry has plain ``def`` handlers (they run in threads, in real
time); the loop then waits in real time as usual. Test bodies measure with ``asyncio.get_running_loop().time()``
(which is ``time.monotonic()`` on a real loop).
"""

from __future__ import annotations

import asyncio
import selectors
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from worker.backends.memory import MemoryClock


class _SkippingSelector:
    """The loop's selector: a wait with nothing ready skips the clock instead of sleeping (unless busy)."""

    def __init__(self, inner: selectors.BaseSelector, clock: MemoryClock, busy: Callable[[], bool]) -> None:
        self.inner = inner
        self.clock = clock
        self.busy = busy

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if (timeout is not None and timeout <= 0) or self.busy():
            return self.inner.select(timeout)
        events = self.inner.select(0)
        if events or timeout is None:  # no timer at all: only I/O (or another thread) can wake the loop
            return events or self.inner.select(timeout)
        self.clock.advance(timeout)
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class VirtualTime:
    """Installed on a loop for the rest of its life (a timer set on the skipped clock would wait the skipped
    seconds in real time once the loop read the real clock again); nested workers share it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, clock: MemoryClock) -> None:
        self.loop = loop
        self.clock = clock
        self.realtime: list[Callable[[], bool]] = []
        self.executor_calls = 0

    def busy(self) -> bool:
        return self.executor_calls > 0 or any(check() for check in self.realtime)

    def install(self) -> None:
        loop: Any = self.loop
        self._selector = loop._selector
        self._run_in_executor = loop.run_in_executor
        loop._selector = _SkippingSelector(self._selector, self.clock, self.busy)
        loop.time = self.clock.monotonic

        def run_in_executor(executor: Any, func: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
            self.executor_calls += 1
            future: asyncio.Future[Any] = self._run_in_executor(executor, func, *args)
            future.add_done_callback(self._executor_done)
            return future

        loop.run_in_executor = run_in_executor

    def _executor_done(self, _: asyncio.Future[Any]) -> None:
        self.executor_calls -= 1


_INSTALLED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, VirtualTime] = weakref.WeakKeyDictionary()


@contextmanager
def virtual_time(clock: MemoryClock, *, realtime: Callable[[], bool] | None = None) -> Iterator[VirtualTime]:
    """Run the current event loop on ``clock`` from now on; ``realtime``: while in the block and it says True,
    never skip."""
    loop = asyncio.get_running_loop()
    installed = _INSTALLED.get(loop)
    if installed is None:
        installed = _INSTALLED[loop] = VirtualTime(loop, clock)
        installed.install()
    if installed.clock is not clock:
        raise RuntimeError("one event loop, one clock")
    if realtime is not None:
        installed.realtime.append(realtime)
    try:
        yield installed
    finally:
        if realtime is not None:
            installed.realtime.remove(realtime)
