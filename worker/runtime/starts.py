"""Handler starts: at most ``concurrency`` jobs run at once. A worker with ``WORKER_PREFETCH`` holds that many
messages more than it runs (received ahead, their claims kept alive by heartbeats); they wait here in the order
they came and start, one for each job that ends, without a receive's round trip in between. At shutdown the
waiting ones are handed back unstarted (``close``), to be released uncounted."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class Starts(Generic[T]):
    """A counter of running jobs with a queue of what waits to start: items (``offer``: the caller starts what it
    is handed) or tasks that wait in place (``wait``: a FIFO group's next message)."""

    def __init__(self, total: int) -> None:
        if total < 1:
            raise ValueError("total must be >= 1")
        self.total = total
        self.running = 0
        self.closed = False
        self._waiting: deque[T | asyncio.Future[bool]] = deque()

    def offer(self, item: T) -> bool:
        """True: ``item`` may start now (it holds a start until ``end``); False: it waits its turn, and ``end``
        hands it over later (or ``close`` gives it back)."""
        if self.running < self.total and not self._waiting and not self.closed:
            self.running += 1
            return True
        self._waiting.append(item)
        return False

    async def wait(self) -> bool:
        """Wait for a start in turn with the offered items: True once held, False when closed first."""
        if self.running < self.total and not self._waiting and not self.closed:
            self.running += 1
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

    def end(self) -> T | None:
        """A job ended: its start goes to the next waiting, if any. Returns an offered item that now holds it
        (the caller starts it); None when a waiting task took it, or none waits."""
        while self._waiting and not self.closed:
            turn = self._waiting.popleft()
            if isinstance(turn, asyncio.Future):
                if turn.done():  # cancelled while waiting
                    continue
                turn.set_result(True)
                return None
            return turn
        self.running -= 1
        return None

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

    @property
    def waiting(self) -> int:
        return len(self._waiting)
