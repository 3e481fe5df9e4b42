"""Starting workflows from a producer (plain boto3): ``chain(a, b, c).start()``, ``group([...], callback=c).start()``.

``start`` writes the workflow's item (conditional: a second ``start`` with the same ``workflow_id`` keeps the
first item) and then sends the first step, or every member, with its fixed idempotency key: starting again
after a crash, or from a job that is retried, sends copies that run once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from worker.backends.aws import sync_client, translate
from worker.envelope import WorkflowRef, dump_envelope
from worker.errors import ConfigError, LedgerUnavailable
from worker.idempotency import KEY_ATTRIBUTE
from worker.producer import Job
from worker.workflows.hooks import deduplication_id
from worker.workflows.model import (
    MAX_MEMBERS,
    ON_FAILURE_CHOICES,
    OnFailure,
    check_workflow_id,
    new_workflow_id,
    step_key,
)
from worker.workflows.store import new_item


@dataclass(frozen=True)
class Target:
    """Where a workflow starts: boto3 SQS and DynamoDB clients, the queue URL and the idempotency table."""

    sqs: Any
    dynamodb: Any
    queue_url: str
    table: str


def resolve_target(
    *, sqs: Any = None, dynamodb: Any = None, queue: str | None = None, table: str | None = None
) -> Target:
    """Fill what is not given from the settings (WORKER_QUEUE, WORKER_IDEMPOTENCY_TABLE) and the AWS variables."""
    from worker.backends.aws import resolve_queue_url_sync
    from worker.enqueue import MemoryProducer, producer_in_use
    from worker.settings import load_settings

    if sqs is None and isinstance(producer_in_use(), MemoryProducer):
        raise ConfigError(
            "chain/group .start() inside the in-memory test kit would reach SQS and DynamoDB: the kit does not run "
            "workflows. Test each step's handler in the kit; run workflows on ./scripts/dev's local AWS"
        )
    if queue is None or table is None:
        settings = load_settings(queue=queue) if queue else load_settings()
        queue = queue or settings.queue
        table = table or settings.idempotency_table
    if not table:
        raise ConfigError("workflows keep their state in the idempotency table: set WORKER_IDEMPOTENCY_TABLE")
    sqs = sqs or sync_client("sqs")
    return Target(sqs, dynamodb or sync_client("dynamodb"), resolve_queue_url_sync(sqs, queue), table)


def _steps(jobs: Iterable[Job]) -> list[Job]:
    steps = list(jobs)
    for job in steps:
        if not isinstance(job, Job):
            raise ConfigError(f"workflow steps are worker.producer.Job objects, got {type(job).__name__}")
        if job.idempotency_key is not None or job.delay_s:
            raise ConfigError(f"workflow step {job.type!r}: the workflow sets its idempotency key; no delay_s")
    if not 1 <= len(steps) <= MAX_MEMBERS:
        raise ConfigError(f"a workflow has 1 to {MAX_MEMBERS} steps, got {len(steps)}")
    return steps


def _put_item(target: Target, workflow_id: str, attributes: dict[str, Any]) -> None:
    item = new_item(workflow_id, now_ms=int(time.time() * 1000), **attributes)
    try:
        target.dynamodb.put_item(
            TableName=target.table,
            Item=item,
            ConditionExpression="attribute_not_exists(#key)",
            ExpressionAttributeNames={"#key": KEY_ATTRIBUTE},
        )
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
            return  # started before (a retry of the same start): keep its item, send the same copies again
        raise LedgerUnavailable(str(translate(exc, "PutItem", service="dynamodb", resource=target.table))) from exc
    except (BotoCoreError, OSError) as exc:
        raise LedgerUnavailable(str(translate(exc, "PutItem", service="dynamodb", resource=target.table))) from exc


def _send(target: Target, bodies: list[tuple[str, str]]) -> None:
    """Send (body, idempotency key) pairs, 10 per SendMessageBatch."""
    fifo = target.queue_url.endswith(".fifo")
    for start in range(0, len(bodies), 10):
        entries: list[dict[str, Any]] = []
        for index, (body, key) in enumerate(bodies[start : start + 10]):
            entry: dict[str, Any] = {"Id": str(index), "MessageBody": body}
            if fifo:
                entry["MessageGroupId"] = key
                entry["MessageDeduplicationId"] = deduplication_id(key)
            entries.append(entry)
        try:
            response = target.sqs.send_message_batch(QueueUrl=target.queue_url, Entries=entries)
        except (BotoCoreError, ClientError, OSError) as exc:
            raise translate(exc, "SendMessageBatch", resource=target.queue_url) from exc
        if response.get("Failed"):
            failed = response["Failed"][0]
            raise ConfigError(f"SQS refused a workflow step: {failed.get('Code')}: {failed.get('Message')}")


@dataclass(frozen=True)
class Chain:
    """Steps run one after another; each is sent when the previous one succeeded, with its result."""

    steps: tuple[Job, ...]
    workflow_id: str | None = None

    def start(
        self, *, sqs: Any = None, dynamodb: Any = None, queue: str | None = None, table: str | None = None
    ) -> str:
        """Write the chain's item and send its first step; returns the workflow id."""
        target = resolve_target(sqs=sqs, dynamodb=dynamodb, queue=queue, table=table)
        workflow_id = check_workflow_id(self.workflow_id or new_workflow_id())
        steps = [{"type": job.type, "payload": job.payload} for job in self.steps]
        _put_item(
            target,
            workflow_id,
            {"kind": "chain", "total": len(steps), "steps": json.dumps(steps), "done_count": 0, "state": "running"},
        )
        first = self.steps[0]
        key = step_key(workflow_id, 0)
        ref = WorkflowRef(id=workflow_id, kind="chain", index=0, total=len(steps))
        _send(target, [(dump_envelope(first.type, first.payload, key, ref), key)])
        return workflow_id


@dataclass(frozen=True)
class Group:
    """Members run in parallel; when the last one finished, ``callback`` is sent once with their results."""

    members: tuple[Job, ...]
    callback: Job
    on_failure: OnFailure = "callback"
    workflow_id: str | None = None

    def start(
        self, *, sqs: Any = None, dynamodb: Any = None, queue: str | None = None, table: str | None = None
    ) -> str:
        """Write the group's item and send every member; returns the workflow id."""
        target = resolve_target(sqs=sqs, dynamodb=dynamodb, queue=queue, table=table)
        workflow_id = check_workflow_id(self.workflow_id or new_workflow_id())
        total = len(self.members)
        _put_item(
            target,
            workflow_id,
            {
                "kind": "group",
                "total": total,
                "types": json.dumps([job.type for job in self.members]),
                "callback": json.dumps({"type": self.callback.type, "payload": self.callback.payload}),
                "on_failure": self.on_failure,
            },
        )
        bodies = []
        for index, job in enumerate(self.members):
            key = step_key(workflow_id, index)
            ref = WorkflowRef(id=workflow_id, kind="group", index=index, total=total)
            bodies.append((dump_envelope(job.type, job.payload, key, ref), key))
        _send(target, bodies)
        return workflow_id


def chain(*steps: Job, workflow_id: str | None = None) -> Chain:
    """``chain(Job("a"), Job("b"), Job("c"))``: b runs when a succeeded (``ctx.previous_result`` is a's result)."""
    return Chain(tuple(_steps(steps)), workflow_id)


def group(
    members: Iterable[Job], *, callback: Job, on_failure: OnFailure = "callback", workflow_id: str | None = None
) -> Group:
    """Fan-out/fan-in: ``callback`` runs once after every member finished (``ctx.previous_result`` holds the
    results in member order and the failures). ``on_failure``: ``"callback"`` runs the callback with the failures
    listed; ``"dead_letter"`` sends the callback's message to the DLQ instead (requeue it to run it anyway)."""
    if on_failure not in ON_FAILURE_CHOICES:
        raise ConfigError(f"on_failure must be one of {', '.join(ON_FAILURE_CHOICES)}")
    _steps([callback])
    return Group(tuple(_steps(members)), callback, on_failure, workflow_id)
