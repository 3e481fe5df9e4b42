"""Handler starts: at most ``concurrency`` jobs run at once. A worker with ``WORKER_PREFETCH`` holds that many
messages more than it runs (received ahead, their claims kept alive by heartbeats); they wait here in the order
they came and start, one for each job that ends, without a receive's round trip in between. At shutdown the
waiting ones are handed back unstarted (``close``), to be released uncounted."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Starts(Generic[T]):
    """A counter of running jobs with a queue of what waits to start: items (``offer``; ``start`` is called with
    each when its turn comes) or tasks that wait in place (``wait``: a FIFO group's next message)."""

    def __init__(self, total: int, start: Callable[[T], None]) -> None:
        if total < 1:
            raise ValueError("total must be >= 1")
        self.total = total
        self._start = start
        self.running = 0
        self.closed = False
        self._waiting: deque[T | asyncio.Future[bool]] = deque()

    def offer(self, item: T) -> None:
        """Start ``item`` now if a start is free (it holds that start until its ``end``), else when its turn comes
        (or ``close`` gives it back)."""
        if self._take():
            self._start(item)
            return
        self._waiting.append(item)

    async def wait(self) -> bool:
        """Wait for a start in turn with the offered items: True once held, False when closed first."""
        if self._take():
            return True
        if self.closed:
            return False
        turn: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append(turn)
        try:
            return await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled() and turn.result():
                self.end()  # handed a start in the same instant: pass it on
            elif turn in self._waiting:
                self._waiting.remove(turn)
            raise

    def _take(self) -> bool:
        """Take a start without waiting: one is free and nothing waits ahead."""
        if self.running < self.total and not self._waiting and not self.closed:
            self.running += 1
            return True
        return False

    def end(self) -> None:
        """A job ended: its start goes to the next waiting, if any (an offered item is started, a waiting task
        woken)."""
        while self._waiting and not self.closed:
            turn = self._waiting.popleft()
            if isinstance(turn, asyncio.Future):
                if turn.done():  # cancelled while waiting
                    continue
                turn.set_result(True)
                return
            self._start(turn)
            return
        self.running -= 1

    def close(self) -> list[T]:
        """Stop starting (shutdown): the offered items still waiting, for the caller to release; waiting tasks are
        told False."""
        self.closed = True
        items: list[T] = []
        while self._waiting:
            turn = self._waiting.popleft()
            if isinstance(turn, asyncio.Future):
                if not turn.done():
                    turn.set_result(False)
            else:
                items.append(turn)
        return items
