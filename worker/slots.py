"""Handler slots: how many more messages this worker may hold. Receive loops reserve slots before they
ask SQS for messages, so a worker never takes more than it can start at once."""

from __future__ import annotations

import asyncio


class Slots:
    """A counter of free handler slots that receive loops can reserve in bulk (at most 10 at a time)."""

    def __init__(self, total: int) -> None:
        if total < 1:
            raise ValueError("total must be >= 1")
        self.total = total
        self.free = total
        self._available = asyncio.Event()
        self._available.set()

    async def reserve(self, most: int) -> int:
        """Wait until at least one slot is free, then take up to ``most`` of them."""
        while self.free == 0:
            self._available.clear()
            await self._available.wait()
        taken = min(most, self.free)
        self.free -= taken
        return taken

    def release(self, count: int = 1) -> None:
        if count <= 0:
            return
        self.free = min(self.total, self.free + count)
        self._available.set()

    @property
    def in_use(self) -> int:
        return self.total - self.free
