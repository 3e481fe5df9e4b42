"""DynamoDB persistence of the ledger: gets, conditional puts and updates, table creation. No policy here.

Items are exchanged with the ledger as plain Python values (str, int, float, None); numbers come back as int
when integral. Conditions and updates come as data (``worker.idempotency.expressions``), rendered here to
DynamoDB's expression text; the in-memory store evaluates the same data.

Transport failures are retried as the store's budget allows (``worker.budgets.LEDGER``: about 5 s); then every
botocore or connection error becomes LedgerUnavailable (fail closed), worded by the edge's one error table
(``worker.backends.aws``). A failed condition is not an error but a WriteResult with ``ok=False`` and the item as it was
(ReturnValuesOnConditionCheckFailure=ALL_OLD).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import aiohttp
from botocore.exceptions import BotoCoreError, ClientError

from worker.backends.aws import call_with_budget, table_unavailable, translate
from worker.budgets import LEDGER, Budget
from worker.errors import LedgerUnavailable
from worker.idempotency.expressions import (
    CONDITIONS,
    Condition,
    Update,
    WriteResult,
    all_of,
    any_of,
    cond,
)

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb.client import DynamoDBClient
    from types_aiobotocore_dynamodb.type_defs import AttributeValueTypeDef

#: The partition key attribute; Terraform's table uses the same name.
KEY_ATTRIBUTE = "key"
#: The TTL attribute (epoch seconds).
TTL_ATTRIBUTE = "expiration"
#: The index that lists items by ``status`` (IN_PROGRESS, FAILED, ..., and the dashboard's WORKER and AUDIT
#: items), newest ``updated_at`` first: the dashboard's lists are Queries of it, never Scans. Terraform's table
#: has the same index.
STATUS_INDEX = "status-updated_at"
STATUS_INDEX_PROJECTED = (
    "job_type",
    "attempts",
    "last_error",
    "progress",
    "progress_note",
    "lease_expires_at_ms",
    "owner",
    "expiration",
    "created_at",
    "detail",
)

_NAME = re.compile(r"#(\w+)")
_VALUE = re.compile(r":(\w+)")
__all__ = [
    "CONDITIONS",
    "KEY_ATTRIBUTE",
    "TTL_ATTRIBUTE",
    "DynamoDBStore",
    "Update",
    "WriteResult",
    "all_of",
    "any_of",
    "cond",
    "create_table",
]
_CONNECTION_ERRORS = (BotoCoreError, aiohttp.ClientError, OSError, asyncio.TimeoutError)


def encode_value(value: object) -> AttributeValueTypeDef:
    """A plain Python value as a DynamoDB attribute value (str, int, float, bool, None only)."""
    if value is None:
        return {"NULL": True}
    if isinstance(value, bool):
        return {"BOOL": value}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, int | float):
        return {"N": repr(value) if isinstance(value, float) else str(value)}
    raise TypeError(f"cannot store a {type(value).__name__} in the ledger")


def decode_value(attribute: Mapping[str, Any]) -> object:
    """A DynamoDB attribute value as plain Python; numbers as int when integral, else float."""
    if "S" in attribute:
        return str(attribute["S"])
    if "N" in attribute:
        text = str(attribute["N"])
        try:
            return int(text)
        except ValueError:
            return float(text)
    if "BOOL" in attribute:
        return bool(attribute["BOOL"])
    if "NULL" in attribute:
        return None
    raise ValueError(f"unsupported DynamoDB attribute type {sorted(attribute)}")


def decode_item(item: Mapping[str, Any] | None) -> dict[str, object] | None:
    if not item:
        return None
    return {name: decode_value(value) for name, value in item.items()}


def _placeholders(expressions: Sequence[str], values: Mapping[str, object]) -> dict[str, Any]:
    """ExpressionAttributeNames and -Values for exactly the placeholders used (DynamoDB rejects unused ones)."""
    text = " ".join(expressions)
    names = {f"#{name}": name for name in _NAME.findall(text)}
    used = set(_VALUE.findall(text))
    missing = used - set(values)
    if missing:
        raise KeyError(f"no value for placeholders {sorted(missing)}")
    arguments: dict[str, Any] = {"ExpressionAttributeNames": names}
    if used:
        arguments["ExpressionAttributeValues"] = {f":{name}": encode_value(values[name]) for name in sorted(used)}
    return arguments


class DynamoDBStore:
    """Reads and conditional writes of ledger items in one table, through an injected aiobotocore client."""

    def __init__(self, client: DynamoDBClient, table_name: str, *, budget: Budget = LEDGER) -> None:
        self._client = client
        self.table_name = table_name
        self._budget = budget

    async def get(self, key: str) -> dict[str, object] | None:
        """The item (strongly consistent read), or None."""
        try:
            response = await call_with_budget(
                lambda: self._client.get_item(
                    TableName=self.table_name, Key={KEY_ATTRIBUTE: {"S": key}}, ConsistentRead=True
                ),
                budget=self._budget,
            )
        except ClientError as exc:
            raise self._unavailable("GetItem", exc) from exc
        except _CONNECTION_ERRORS as exc:
            raise self._unavailable("GetItem", exc) from exc
        return decode_item(response.get("Item"))

    async def update(
        self, key: str, update: Update, *, condition: Condition, values: Mapping[str, object], return_new: bool = False
    ) -> WriteResult:
        """One conditional UpdateItem. ``ok=False`` with the old item when the condition fails."""
        update_text, update_values = update.expression()
        condition_text = condition.render()
        arguments = _placeholders([update_text, condition_text], {**values, **update_values})
        try:
            response = await call_with_budget(
                lambda: self._client.update_item(
                    TableName=self.table_name,
                    Key={KEY_ATTRIBUTE: {"S": key}},
                    UpdateExpression=update_text,
                    ConditionExpression=condition_text,
                    ReturnValues="ALL_NEW" if return_new else "NONE",
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

    async def put(
        self, item: Mapping[str, object], *, condition: Condition, values: Mapping[str, object]
    ) -> WriteResult:
        """One conditional PutItem replacing the whole item. ``ok=False`` with the old item when refused."""
        condition_text = condition.render()
        arguments = _placeholders([condition_text], values)
        try:
            await call_with_budget(
                lambda: self._client.put_item(
                    TableName=self.table_name,
                    Item={name: encode_value(value) for name, value in item.items() if value is not None},
                    ConditionExpression=condition_text,
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                    **arguments,
                ),
                budget=self._budget,
            )
        except ClientError as exc:
            return self._condition_failed(exc, "PutItem")
        except _CONNECTION_ERRORS as exc:
            raise self._unavailable("PutItem", exc) from exc
        return WriteResult(True, dict(item))

    def _condition_failed(self, exc: ClientError, operation: str) -> WriteResult:
        if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
            raise self._unavailable(operation, exc) from exc
        old = exc.response.get("Item")  # botocore puts ALL_OLD here
        return WriteResult(False, decode_item(old if isinstance(old, Mapping) else None))

    def _unavailable(self, operation: str, exc: Exception) -> LedgerUnavailable:
        """Every failure of a running ledger is LedgerUnavailable (fail closed), worded by the edge's table."""
        return table_unavailable(exc, operation, table=self.table_name, client=self._client)


def status_index() -> Any:
    """The GlobalSecondaryIndex definition of STATUS_INDEX (hash ``status``, range ``updated_at``)."""
    return {
        "IndexName": STATUS_INDEX,
        "KeySchema": [
            {"AttributeName": "status", "KeyType": "HASH"},
            {"AttributeName": "updated_at", "KeyType": "RANGE"},
        ],
        "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": list(STATUS_INDEX_PROJECTED)},
    }


_INDEX_ATTRIBUTES: list[Any] = [
    {"AttributeName": "status", "AttributeType": "S"},
    {"AttributeName": "updated_at", "AttributeType": "N"},
]


async def create_table(client: DynamoDBClient, name: str, *, wait_s: float = 120.0) -> bool:
    """Create the ledger table (on-demand billing, partition key ``key`` (S), TTL on ``expiration``, the index
    STATUS_INDEX; an existing table without the index gets it added).

    Failures are translated by the edge's table: ConfigError (credentials, access), LedgerUnavailable (the rest).

    Idempotent: an existing table is left as is, and TTL is enabled on it when it is not yet. Returns whether
    the table was created. Waits (at most ``wait_s``) until the table is ACTIVE before enabling TTL.
    """
    created = True
    try:
        await client.create_table(
            TableName=name,
            AttributeDefinitions=[{"AttributeName": KEY_ATTRIBUTE, "AttributeType": "S"}, *_INDEX_ATTRIBUTES],
            KeySchema=[{"AttributeName": KEY_ATTRIBUTE, "KeyType": "HASH"}],
            GlobalSecondaryIndexes=[status_index()],
            BillingMode="PAY_PER_REQUEST",
        )
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "ResourceInUseException":
            raise translate(exc, "CreateTable", service="dynamodb", resource=name) from exc
        created = False
    except _CONNECTION_ERRORS as exc:
        raise translate(exc, "CreateTable", service="dynamodb", resource=name) from exc
    try:
        delay_s = 1.0
        waiter = client.get_waiter("table_exists")
        await waiter.wait(
            TableName=name, WaiterConfig={"Delay": int(delay_s), "MaxAttempts": max(1, int(wait_s / delay_s))}
        )
        if not created:
            await _ensure_status_index(client, name)
        ttl = await client.describe_time_to_live(TableName=name)
        description = ttl.get("TimeToLiveDescription", {})
        if description.get("TimeToLiveStatus") not in ("ENABLED", "ENABLING"):
            await client.update_time_to_live(
                TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE}
            )
    except (ClientError, *_CONNECTION_ERRORS) as exc:
        raise translate(exc, "UpdateTimeToLive", service="dynamodb", resource=name) from exc
    return created


async def _ensure_status_index(client: DynamoDBClient, name: str) -> None:
    """Add STATUS_INDEX to a table made before it existed (DynamoDB backfills it in the background)."""
    table = (await client.describe_table(TableName=name)).get("Table", {})
    if any(index.get("IndexName") == STATUS_INDEX for index in table.get("GlobalSecondaryIndexes", [])):
        return
    await client.update_table(
        TableName=name,
        AttributeDefinitions=_INDEX_ATTRIBUTES,
        GlobalSecondaryIndexUpdates=[{"Create": status_index()}],
    )
