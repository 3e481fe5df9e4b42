"""Dead letters of the Cloud Tasks backend: a DynamoDB table the worker writes and the ``dlq`` commands read.

Cloud Tasks has no dead-letter queue: a task whose last attempt fails is dropped. So the worker records each
dead letter itself, before it answers 2xx. Table (on-demand billing): partition key ``queue`` (S, the queue id),
sort key ``task`` (S, the task name), so listing one queue is a Query and a record is found by its task name; a
second record of the same task (a duplicate delivery) overwrites the first instead of doubling it.

An item holds the SQS dead-letter record's attributes (``error_category``, ``error_message``, ``attempts``,
``failed_at``, ``source_queue``, ``original_message_id`` = the task name) as strings, ``job_type`` when known, and
the body byte for byte (``body``, Binary). A body larger than BODY_CHUNK_BYTES (an item holds at most 400 KB, a
task up to 1 MB) is split: the first part in the record, the others in items ``<task>#part<N>`` written before
it, so a record never lacks a part.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from worker.backends.aws import Trouble, classify, is_transient, translate
from worker.budgets import Budget, retry_delay_s
from worker.deadletter import OUR_ATTRIBUTES, dead_letter_record
from worker.errors import ConfigError, QueueUnavailable, WorkerError

log = logging.getLogger("worker.cloudtasks")

PARTITION_KEY = "queue"
SORT_KEY = "task"
BODY_CHUNK_BYTES = 300_000
PART_MARK = "#part"
#: Our attributes' values are sanitized and capped as on SQS; this budget never trims them.
RECORD_BYTES = 64 * 1024


@dataclass(frozen=True)
class StoredDeadLetter:
    """One dead letter as kept in the table."""

    queue: str
    task: str
    body: bytes
    attributes: dict[str, str]  # error_category, error_message, attempts, failed_at, source_queue, ...
    job_type: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def category(self) -> str | None:
        return self.attributes.get("error_category")


def make_record(
    *,
    queue: str,
    task: str,
    body: bytes,
    category: str,
    error: str,
    attempts: int,
    job_type: str | None,
    failed_at: datetime | None = None,
) -> StoredDeadLetter:
    """The record of a dead letter, with the attributes the SQS backend gives (same names, same sanitizing)."""
    record = dead_letter_record(
        category=category,
        error_message=error,
        attempts=attempts,
        source_queue=queue,
        original_message_id=task,
        failed_at=failed_at or datetime.now(UTC),
        max_message_bytes=RECORD_BYTES,
    )
    attributes = {name: str(value["StringValue"]) for name, value in record.attributes.items()}
    return StoredDeadLetter(queue=queue, task=task, body=body, attributes=attributes, job_type=job_type)


def _item(record: StoredDeadLetter) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The record's item and its extra part items (DynamoDB's typed form)."""
    chunks = [record.body[i : i + BODY_CHUNK_BYTES] for i in range(0, len(record.body), BODY_CHUNK_BYTES)] or [b""]
    item: dict[str, Any] = {
        PARTITION_KEY: {"S": record.queue},
        SORT_KEY: {"S": record.task},
        "body": {"B": chunks[0]},
        "parts": {"N": str(len(chunks))},
        **{name: {"S": value} for name, value in record.attributes.items() if value},
        **{name: {"S": value} for name, value in record.extra.items() if value},
    }
    if record.job_type:
        item["job_type"] = {"S": record.job_type}
    parts = [
        {PARTITION_KEY: {"S": record.queue}, SORT_KEY: {"S": f"{record.task}{PART_MARK}{n}"}, "body": {"B": chunk}}
        for n, chunk in enumerate(chunks[1:], start=1)
    ]
    return item, parts


def _record(item: dict[str, Any], parts: list[bytes]) -> StoredDeadLetter:
    def text(name: str) -> str | None:
        value = item.get(name, {})
        return value.get("S") if isinstance(value, dict) else None

    attributes = {name: value for name in OUR_ATTRIBUTES if (value := text(name)) is not None}
    extra = {
        name: value["S"]
        for name, value in item.items()
        if isinstance(value, dict)
        and "S" in value
        and name not in attributes
        and name not in (PARTITION_KEY, SORT_KEY, "job_type")
    }
    body = bytes(item.get("body", {}).get("B", b"")) + b"".join(parts)
    return StoredDeadLetter(
        queue=text(PARTITION_KEY) or "",
        task=text(SORT_KEY) or "",
        body=body,
        attributes=attributes,
        job_type=text("job_type"),
        extra=extra,
    )


def translate_dead_letter_error(exc: BaseException, action: str, table: str) -> WorkerError:
    """``translate`` for a call on the dead-letter table: a missing table names it and its setting (not the
    idempotency table's)."""
    if classify(exc) is Trouble.MISSING:
        return ConfigError(
            f"{action}: dead-letter table {table!r} does not exist: run `sqs-worker bootstrap` or fix "
            "WORKER_CLOUDTASKS_DEAD_LETTER_TABLE"
        )
    return translate(exc, action, service="dynamodb", resource=table)


class DeadLetterStore:
    """Reads and writes dead-letter records of one queue in ``table`` (an aiobotocore DynamoDB client)."""

    def __init__(self, client: Any, table: str, queue: str) -> None:
        self.client = client
        self.table = table
        self.queue = queue

    def _error(self, exc: BaseException, action: str) -> Exception:
        error = translate_dead_letter_error(exc, action, self.table)
        if isinstance(error, ConfigError):
            return error
        return QueueUnavailable(f"dead-letter table {self.table!r}: {error}")

    async def put(self, record: StoredDeadLetter) -> None:
        """Write the record (its extra parts first). Raises QueueUnavailable or ConfigError."""
        item, parts = _item(record)
        try:
            for part in parts:
                await self.client.put_item(TableName=self.table, Item=part)
            await self.client.put_item(TableName=self.table, Item=item)
        except (BotoCoreError, ClientError, OSError) as exc:
            raise self._error(exc, "PutItem") from exc

    async def put_within(self, record: StoredDeadLetter, *, give_up_after_s: float) -> None:
        """``put``, retried on transport trouble with backoff for up to ``give_up_after_s``; then the last error."""
        budget = Budget("PutItem of a dead letter", 0.2, 5.0, give_up_after_s, "the request answers 503")
        started, failures = time.monotonic(), 0
        while True:
            try:
                await self.put(record)
                return
            except QueueUnavailable as exc:
                failures += 1
                delay_s = retry_delay_s(
                    budget=budget, failures=failures, elapsed_s=time.monotonic() - started, jitter=random.random()
                )
                if delay_s is None or not is_transient(exc.__cause__ or exc):
                    raise
                log.warning("dead-letter record of %s not written (try %d): %s", record.task, failures, exc)
                await asyncio.sleep(delay_s)

    async def get(self, task: str) -> StoredDeadLetter | None:
        try:
            response = await self.client.get_item(
                TableName=self.table, Key={PARTITION_KEY: {"S": self.queue}, SORT_KEY: {"S": task}}, ConsistentRead=True
            )
        except (BotoCoreError, ClientError, OSError) as exc:
            raise self._error(exc, "GetItem") from exc
        item = response.get("Item")
        return None if item is None else await self._assemble(item)

    async def list(self, *, limit: int) -> list[StoredDeadLetter]:
        """Up to ``limit`` records of the queue (Query, in task-name order)."""
        records: list[StoredDeadLetter] = []
        start: dict[str, Any] | None = None
        while len(records) < limit:
            kwargs: dict[str, Any] = {
                "TableName": self.table,
                "KeyConditionExpression": "#q = :q",
                "ExpressionAttributeNames": {"#q": PARTITION_KEY},
                "ExpressionAttributeValues": {":q": {"S": self.queue}},
                "ConsistentRead": True,
            }
            if start is not None:
                kwargs["ExclusiveStartKey"] = start
            try:
                page = await self.client.query(**kwargs)
            except (BotoCoreError, ClientError, OSError) as exc:
                raise self._error(exc, "Query") from exc
            for item in page.get("Items", []):
                if PART_MARK in item[SORT_KEY]["S"] or len(records) >= limit:
                    continue
                records.append(await self._assemble(item))
            start = page.get("LastEvaluatedKey")
            if not start:
                break
        return records

    async def delete(self, record: StoredDeadLetter) -> None:
        """Remove the record, then its extra parts."""
        parts = self._parts_of(record)
        keys = [record.task] + [f"{record.task}{PART_MARK}{n}" for n in range(1, parts)]
        try:
            for task in keys:
                await self.client.delete_item(
                    TableName=self.table, Key={PARTITION_KEY: {"S": self.queue}, SORT_KEY: {"S": task}}
                )
        except (BotoCoreError, ClientError, OSError) as exc:
            raise self._error(exc, "DeleteItem") from exc

    @staticmethod
    def _parts_of(record: StoredDeadLetter) -> int:
        return max(1, -(-len(record.body) // BODY_CHUNK_BYTES))

    async def _assemble(self, item: dict[str, Any]) -> StoredDeadLetter:
        parts: list[bytes] = []
        count = int(item.get("parts", {}).get("N", "1"))
        task = item[SORT_KEY]["S"]
        for n in range(1, count):
            try:
                response = await self.client.get_item(
                    TableName=self.table,
                    Key={PARTITION_KEY: {"S": self.queue}, SORT_KEY: {"S": f"{task}{PART_MARK}{n}"}},
                    ConsistentRead=True,
                )
            except (BotoCoreError, ClientError, OSError) as exc:
                raise self._error(exc, "GetItem") from exc
            parts.append(bytes(response.get("Item", {}).get("body", {}).get("B", b"")))
        return _record(item, parts)


async def create_dead_letter_table(client: Any, name: str, *, wait_s: float = 120.0) -> bool:
    """Create the dead-letter table unless it exists; returns whether it was created."""
    try:
        await client.create_table(
            TableName=name,
            AttributeDefinitions=[
                {"AttributeName": PARTITION_KEY, "AttributeType": "S"},
                {"AttributeName": SORT_KEY, "AttributeType": "S"},
            ],
            KeySchema=[
                {"AttributeName": PARTITION_KEY, "KeyType": "HASH"},
                {"AttributeName": SORT_KEY, "KeyType": "RANGE"},
            ],
            BillingMode="PAY_PER_REQUEST",
        )
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "ResourceInUseException":
            raise translate(exc, "CreateTable", service="dynamodb", resource=name) from exc
        return False
    except (BotoCoreError, OSError) as exc:
        raise translate(exc, "CreateTable", service="dynamodb", resource=name) from exc
    waiter = client.get_waiter("table_exists")
    await waiter.wait(TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": max(1, int(wait_s))})
    return True
