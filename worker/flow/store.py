"""Where rate-limit slots and breaker states live: the idempotency table (shared by the fleet) or this process.

Items in ``WORKER_IDEMPOTENCY_TABLE``, under prefixes no idempotency key of the worker's own making takes (a
producer's ``idempotency_key`` should not start with ``sqs-worker:``):

- ``sqs-worker:rate:<key>``: ``tat_ms`` (the key's next slot, see ``worker.flow.gcra``), ``expiration``;
- ``sqs-worker:breaker:<key>``: the ``worker.flow.breaker.Record`` fields, ``breaker_key``, ``expiration``;
- ``sqs-worker:breakers``: ``keys``, a string set naming every breaker key written (``breakers list`` reads it
  instead of scanning the ledger).

Every write is one conditional UpdateItem/PutItem; a refused one answers with the item as it was
(ReturnValuesOnConditionCheckFailure=ALL_OLD), so no read follows. No policy here: ``gcra`` and ``breaker`` decide.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

from botocore.exceptions import ClientError

from worker.backends.aws import call_with_budget
from worker.flow import gcra
from worker.flow.breaker import Record, State
from worker.idempotency.dynamodb import _CONNECTION_ERRORS, KEY_ATTRIBUTE, DynamoDBStore, Update, _placeholders
from worker.idempotency.expressions import Absent, Compare, Condition

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb.client import DynamoDBClient

RATE_PREFIX = "sqs-worker:rate:"
BREAKER_PREFIX = "sqs-worker:breaker:"
BREAKER_INDEX = "sqs-worker:breakers"
#: Items outlive their last write by this much (then DynamoDB's TTL sweeps them).
KEEP_S = 7 * 24 * 3600


@dataclass(frozen=True)
class SlotAnswer:
    """A slot write's answer: ``ok`` and the key's ``tat_ms`` after it (ok) or as it was (refused; None: no item)."""

    ok: bool
    tat_ms: float | None


class FlowStore(Protocol):
    """What the gate needs from a store: one write per slot, breaker records with a version check."""

    shared: bool

    async def take_slot(self, key: str, plan: gcra.Plan) -> SlotAnswer: ...

    async def breaker(self, key: str) -> Record | None: ...

    async def write_breaker(self, key: str, record: Record, *, seen_version: int | None) -> tuple[bool, Record | None]:
        """Write ``record`` if the stored version is ``seen_version`` (None: no item). Refused: the stored one."""
        ...


class MemoryFlowStore:
    """The same in this process: limits and breakers for a single worker (no table configured)."""

    shared = False

    def __init__(self) -> None:
        self._tat_ms: dict[str, float] = {}
        self._breakers: dict[str, Record] = {}

    async def take_slot(self, key: str, plan: gcra.Plan) -> SlotAnswer:
        current = self._tat_ms.get(key)
        new = gcra.apply(plan, current)
        if new is None:
            return SlotAnswer(False, current)
        self._tat_ms[key] = new
        return SlotAnswer(True, new)

    async def breaker(self, key: str) -> Record | None:
        return self._breakers.get(key)

    async def write_breaker(self, key: str, record: Record, *, seen_version: int | None) -> tuple[bool, Record | None]:
        current = self._breakers.get(key)
        if (current.version if current is not None else None) != seen_version:
            return False, current
        self._breakers[key] = record
        return True, record


class DynamoFlowStore(DynamoDBStore):
    """Slots and breakers as items of the idempotency table, through the injected aiobotocore client."""

    shared = True

    def __init__(self, client: DynamoDBClient, table_name: str, **kwargs: Any) -> None:
        super().__init__(client, table_name, **kwargs)
        self._indexed: set[str] = set()

    async def take_slot(self, key: str, plan: gcra.Plan) -> SlotAnswer:
        if plan.form is gcra.Form.IDLE:
            expression = "SET #tat_ms = :new_tat_ms, #expiration = :expiration"
            condition = "(attribute_not_exists(#tat_ms) OR #tat_ms <= :now_ms)"
            new_tat_ms = plan.now_ms + plan.interval_ms
        elif plan.form is gcra.Form.QUEUE:
            expression = "SET #tat_ms = #tat_ms + :interval_ms, #expiration = :expiration"
            condition = "(#tat_ms > :now_ms AND #tat_ms <= :latest_ms)"
            new_tat_ms = plan.latest_ms + plan.interval_ms
        else:
            raise ValueError("a saturated plan takes no slot")
        values = {
            "new_tat_ms": new_tat_ms,
            "now_ms": plan.now_ms,
            "interval_ms": plan.interval_ms,
            "latest_ms": plan.latest_ms,
            "expiration": math.ceil(new_tat_ms / 1000) + KEEP_S,
        }
        result = await self._raw_update(RATE_PREFIX + key, expression, condition, values)
        tat = None if result.item is None else result.item.get("tat_ms")
        return SlotAnswer(result.ok, float(tat) if isinstance(tat, int | float) else None)

    async def _raw_update(self, key: str, expression: str, condition: str, values: Mapping[str, object]) -> Any:
        """One conditional UpdateItem with a hand-written SET (arithmetic that ``Update`` does not compose)."""
        from worker.idempotency.dynamodb import WriteResult, decode_item

        arguments = _placeholders([expression, condition], values)
        try:
            response = await call_with_budget(
                lambda: self._client.update_item(
                    TableName=self.table_name,
                    Key={KEY_ATTRIBUTE: {"S": key}},
                    UpdateExpression=expression,
                    ConditionExpression=condition,
                    ReturnValues="UPDATED_NEW",
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                    **arguments,
                ),
                budget=self._budget,
            )
        except ClientError as exc:
            return self._condition_failed(exc, "UpdateItem")
        except _CONNECTION_ERRORS as exc:
            raise self._unavailable("UpdateItem", exc) from exc
        return WriteResult(True, decode_item(response.get("Attributes")))

    async def breaker(self, key: str) -> Record | None:
        return record_of(await self.get(BREAKER_PREFIX + key))

    async def write_breaker(self, key: str, record: Record, *, seen_version: int | None) -> tuple[bool, Record | None]:
        fields = asdict(record)
        fields["state"] = record.state.value
        write_id = uuid.uuid4().hex  # names this write: a retry refused by its own landed first send sees it
        assign = {
            **fields,
            "breaker_key": key,
            "write_id": write_id,
            "expiration": math.ceil(record.changed_at_ms / 1000) + KEEP_S,
        }
        remove = [name for name, value in assign.items() if value is None]
        update = Update(assign={k: v for k, v in assign.items() if v is not None}, remove=remove)
        if seen_version is None:
            condition: Condition = Absent("key")
            values: dict[str, object] = {}
        else:
            condition, values = Compare("version", "=", "seen_version"), {"seen_version": seen_version}
        result = await self.update(BREAKER_PREFIX + key, update, condition=condition, values=values)
        if not result.ok and not (result.item is not None and result.item.get("write_id") == write_id):
            return False, record_of(result.item)
        if key not in self._indexed:
            await self._index(key)
        return True, record

    async def _index(self, key: str) -> None:
        """Name ``key`` in the breaker index (once per key and process; ADD to a set is idempotent)."""
        try:
            await call_with_budget(
                lambda: self._client.update_item(
                    TableName=self.table_name,
                    Key={KEY_ATTRIBUTE: {"S": BREAKER_INDEX}},
                    UpdateExpression="ADD #keys :key",
                    ExpressionAttributeNames={"#keys": "keys"},
                    ExpressionAttributeValues={":key": {"SS": [key]}},
                ),
                budget=self._budget,
            )
        except (ClientError, *_CONNECTION_ERRORS) as exc:
            raise self._unavailable("UpdateItem", exc) from exc
        self._indexed.add(key)

    async def breaker_keys(self) -> list[str]:
        """Every breaker key the index names (``breakers list``)."""
        try:
            response = await call_with_budget(
                lambda: self._client.get_item(
                    TableName=self.table_name, Key={KEY_ATTRIBUTE: {"S": BREAKER_INDEX}}, ConsistentRead=True
                ),
                budget=self._budget,
            )
        except (ClientError, *_CONNECTION_ERRORS) as exc:
            raise self._unavailable("GetItem", exc) from exc
        item = response.get("Item") or {}
        return sorted(item.get("keys", {}).get("SS", []))

    async def breakers(self) -> dict[str, Record]:
        """Every indexed breaker with its record (a key whose item expired is left out)."""
        keys = await self.breaker_keys()
        records = await asyncio.gather(*(self.breaker(key) for key in keys))
        return {key: record for key, record in zip(keys, records, strict=True) if record is not None}

    async def reset_breaker(self, key: str) -> bool:
        """Close ``key``'s breaker (delete its item; the next failure starts a new window). False: no such item.
        The next item of the key starts at a version of its own (``Gate``), which no record of this one has."""
        try:
            response = await call_with_budget(
                lambda: self._client.delete_item(
                    TableName=self.table_name, Key={KEY_ATTRIBUTE: {"S": BREAKER_PREFIX + key}}, ReturnValues="ALL_OLD"
                ),
                budget=self._budget,
            )
        except (ClientError, *_CONNECTION_ERRORS) as exc:
            raise self._unavailable("DeleteItem", exc) from exc
        return bool(response.get("Attributes"))


def record_of(item: Mapping[str, object] | None) -> Record | None:
    """A breaker item as a Record (None: no item)."""
    if not item:
        return None

    def number(name: str) -> int:
        value = item.get(name)
        return int(value) if isinstance(value, int | float) else 0

    owner = item.get("probe_owner")
    return Record(
        state=State(str(item.get("state", State.CLOSED.value))),
        failures=number("failures"),
        window_start_ms=number("window_start_ms"),
        open_until_ms=number("open_until_ms"),
        probe_owner=owner if isinstance(owner, str) else None,
        probe_until_ms=number("probe_until_ms"),
        changed_at_ms=number("changed_at_ms"),
        version=number("version"),
    )
