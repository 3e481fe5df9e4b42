"""Workflow items in DynamoDB: one conditional UpdateItem per finished step or member. No policy here.

Each write is conditional and returns the item (after it when it went through, before it when the condition
refused it: ``ReturnValuesOnConditionCheckFailure=ALL_OLD``), so a duplicate finish costs one refused write and
no read. Failures other than a refused condition become LedgerUnavailable (the table is the ledger's), retried
within the ledger's budget first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import aiohttp
from botocore.exceptions import BotoCoreError, ClientError

from worker.backends.aws import call_with_budget, table_unavailable
from worker.budgets import LEDGER, Budget
from worker.errors import LedgerUnavailable
from worker.idempotency import KEY_ATTRIBUTE
from worker.workflows.model import WORKFLOW_TTL_S, item_key

_CONNECTION_ERRORS = (BotoCoreError, aiohttp.ClientError, OSError, asyncio.TimeoutError)
Item = dict[str, Any]


def encode(value: Any) -> dict[str, Any]:
    """str, int, float, bool, None, or a set of str (a String Set) as a DynamoDB attribute value."""
    if value is None:
        return {"NULL": True}
    if isinstance(value, bool):
        return {"BOOL": value}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, int | float):
        return {"N": str(value)}
    if isinstance(value, set | frozenset):
        return {"SS": sorted(value)}
    raise TypeError(f"cannot store a {type(value).__name__} in a workflow item")


def decode(item: Mapping[str, Any] | None) -> Item | None:
    if not item:
        return None
    out: Item = {}
    for name, value in item.items():
        if "S" in value:
            out[name] = value["S"]
        elif "N" in value:
            text = str(value["N"])
            out[name] = int(text) if text.lstrip("-").isdigit() else float(text)
        elif "SS" in value:
            out[name] = set(value["SS"])
        elif "BOOL" in value:
            out[name] = bool(value["BOOL"])
        else:
            out[name] = None
    return out


def new_item(workflow_id: str, *, now_ms: int, **attributes: Any) -> dict[str, Any]:
    """A new workflow item in DynamoDB's wire format (for PutItem)."""
    values = {
        KEY_ATTRIBUTE: item_key(workflow_id),
        "created_at": now_ms,
        "updated_at": now_ms,
        "expiration": now_ms // 1000 + WORKFLOW_TTL_S,
        **attributes,
    }
    return {name: encode(value) for name, value in values.items() if value is not None}


class WorkflowStore:
    """Reads and conditional writes of workflow items, through an injected aiobotocore DynamoDB client."""

    def __init__(self, client: Any, table_name: str, *, budget: Budget = LEDGER) -> None:
        self._client = client
        self.table_name = table_name
        self._budget = budget

    async def get(self, workflow_id: str) -> Item | None:
        return await self.get_key(item_key(workflow_id))

    async def get_key(self, key: str) -> Item | None:
        try:
            response = await call_with_budget(
                lambda: self._client.get_item(
                    TableName=self.table_name, Key={KEY_ATTRIBUTE: {"S": key}}, ConsistentRead=True
                ),
                budget=self._budget,
            )
        except (ClientError, *_CONNECTION_ERRORS) as exc:
            raise self._unavailable("GetItem", exc) from exc
        return decode(response.get("Item"))

    async def update(
        self,
        workflow_id: str,
        *,
        assign: Mapping[str, Any],
        add: Mapping[str, set[str]] | None = None,
        remove: tuple[str, ...] = (),
        condition: str,
        values: Mapping[str, Any] | None = None,
        now_ms: int,
    ) -> tuple[bool, Item | None]:
        """One conditional UpdateItem: SET ``assign`` (and ``updated_at``), ADD to the sets of ``add``, REMOVE
        ``remove``. ``condition`` uses ``#name`` for attribute names and ``:name`` for ``values``. Returns (went
        through, the item after it) or (False, the item before it, None when there is none)."""
        assign = {**assign, "updated_at": now_ms}
        text = "SET " + ", ".join(f"#{name} = :set_{name}" for name in assign)
        if add:
            text += " ADD " + ", ".join(f"#{name} :add_{name}" for name in add)
        if remove:
            text += " REMOVE " + ", ".join(f"#{name}" for name in remove)
        names = {f"#{name}": name for name in [*assign, *(add or {}), *remove]}
        names.update({f"#{name}": name for name in _placeholders(condition, "#")})
        attribute_values = {f":set_{name}": encode(value) for name, value in assign.items()}
        attribute_values.update({f":add_{name}": encode(value) for name, value in (add or {}).items()})
        attribute_values.update({f":{name}": encode(value) for name, value in (values or {}).items()})
        try:
            response = await call_with_budget(
                lambda: self._client.update_item(
                    TableName=self.table_name,
                    Key={KEY_ATTRIBUTE: {"S": item_key(workflow_id)}},
                    UpdateExpression=text,
                    ConditionExpression=condition,
                    ExpressionAttributeNames=names,
                    ExpressionAttributeValues=attribute_values,
                    ReturnValues="ALL_NEW",
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                ),
                budget=self._budget,
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                raise self._unavailable("UpdateItem", exc) from exc
            old = exc.response.get("Item")
            return False, decode(old if isinstance(old, Mapping) else None)
        except _CONNECTION_ERRORS as exc:
            raise self._unavailable("UpdateItem", exc) from exc
        return True, decode(response.get("Attributes"))

    async def batch_get(self, keys: list[str]) -> dict[str, Item]:
        """The items of ``keys`` that exist (strongly consistent), 100 per BatchGetItem; unprocessed keys (DynamoDB
        throttling) are asked again, within the budget's retries."""
        found: dict[str, Item] = {}
        for start in range(0, len(keys), 100):
            pending = [{KEY_ATTRIBUTE: {"S": key}} for key in keys[start : start + 100]]
            for _ in range(10):
                request = {self.table_name: {"Keys": pending, "ConsistentRead": True}}
                try:
                    response = await call_with_budget(
                        lambda request=request: self._client.batch_get_item(RequestItems=request),  # type: ignore[misc]
                        budget=self._budget,
                    )
                except (ClientError, *_CONNECTION_ERRORS) as exc:
                    raise self._unavailable("BatchGetItem", exc) from exc
                for raw in response.get("Responses", {}).get(self.table_name, []):
                    item = decode(raw)
                    if item is not None:
                        found[str(item[KEY_ATTRIBUTE])] = item
                pending = response.get("UnprocessedKeys", {}).get(self.table_name, {}).get("Keys", [])
                if not pending:
                    break
                await asyncio.sleep(0.05)
            else:
                raise LedgerUnavailable(f"BatchGetItem on {self.table_name}: keys left unprocessed after 10 tries")
        return found

    def _unavailable(self, operation: str, exc: Exception) -> LedgerUnavailable:
        return table_unavailable(exc, operation, table=self.table_name, client=self._client)


def _placeholders(text: str, sigil: str) -> set[str]:
    import re

    return set(re.findall(re.escape(sigil) + r"(\w+)", text))
