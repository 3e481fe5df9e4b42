"""Workflows: ``chain`` (steps one after another) and ``group`` (fan-out/fan-in with a callback).

- ``start``: the producer side (plain boto3): write the workflow's item, send the first step or the members.
- ``hooks``: the worker side: advance a chain, count a group member, send the callback exactly when due.
- ``store``: the workflow item's conditional writes in the idempotency table.
- ``status``: a workflow's progress, as ``sqs-worker status`` prints it.
- ``model``: keys, result packing and the status of an item (pure).
"""

from worker.workflows.hooks import WorkflowHooks, recorded_result
from worker.workflows.model import WorkflowStatus, callback_key, item_key, read_status, step_key
from worker.workflows.start import Chain, Group, chain, group
from worker.workflows.status import load_status, workflow_status
from worker.workflows.store import WorkflowStore

__all__ = [
    "Chain",
    "Group",
    "WorkflowHooks",
    "WorkflowStatus",
    "WorkflowStore",
    "callback_key",
    "chain",
    "group",
    "item_key",
    "load_status",
    "read_status",
    "recorded_result",
    "step_key",
    "workflow_status",
]
