"""The ledger's items in memory: the same conditional writes as DynamoDB, evaluated on plain dicts.

A :class:`~worker.backends.protocols.LedgerStore` for tests and ``worker.testing``. Conditions and updates are
the data of ``worker.idempotency.expressions`` that ``DynamoDBStore`` renders to text: a write is applied only
when its condition holds on the item as it is, and each write is atomic (one lock), as DynamoDB serialises
writes to an item. Values are stored as DynamoDB would return them (``None`` in a put is left out). TTL never
removes items here (as on moto and LocalStack); the ledger treats an expired item as absent by itself.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from worker.idempotency.dynamodb import KEY_ATTRIBUTE
from worker.idempotency.expressions import Condition, Update, WriteResult


class MemoryStore:
    """Ledger items in a dict, with DynamoDB's conditional-write semantics (a LedgerStore)."""

    def __init__(self, table_name: str = "memory") -> None:
        self._table_name = table_name
        self._items: dict[str, dict[str, object]] = {}
        self._lock = threading.Lock()
        self.writes = 0

    @property
    def table_name(self) -> str:
        return self._table_name

    async def get(self, key: str) -> dict[str, object] | None:
        with self._lock:
            item = self._items.get(key)
            return dict(item) if item is not None else None

    async def update(
        self, key: str, update: Update, *, condition: Condition, values: Mapping[str, object], return_new: bool = False
    ) -> WriteResult:
        with self._lock:
            self.writes += 1
            old = self._items.get(key)
            if not condition.holds(old, values):
                return WriteResult(False, dict(old) if old is not None else None)
            new = update.apply(old, key_attribute=KEY_ATTRIBUTE, key=key)
            self._items[key] = new
            return WriteResult(True, dict(new) if return_new else None)

    async def put(
        self, item: Mapping[str, object], *, condition: Condition, values: Mapping[str, object]
    ) -> WriteResult:
        key = item.get(KEY_ATTRIBUTE)
        if not isinstance(key, str):
            raise ValueError(f"an item needs a string {KEY_ATTRIBUTE!r}")
        with self._lock:
            self.writes += 1
            old = self._items.get(key)
            if not condition.holds(old, values):
                return WriteResult(False, dict(old) if old is not None else None)
            self._items[key] = {name: value for name, value in item.items() if value is not None}
            return WriteResult(True, dict(item))

    def items(self) -> dict[str, dict[str, object]]:
        """A copy of every item, by key (for tests to inspect)."""
        with self._lock:
            return {key: dict(item) for key, item in self._items.items()}
