"""Idempotency: a job's effect happens once, through duplicate deliveries and crashes.

- ``keys``: which key guards a message (pure).
- ``ledger``: claim/renew/complete/release/fail of a key, with fencing tokens and rate-limited progress.
- ``dynamodb``: the table's reads and conditional writes, and ``create_table`` for ``sqs-worker bootstrap``.
"""

from worker.idempotency.dynamodb import KEY_ATTRIBUTE, TTL_ATTRIBUTE, DynamoDBStore, create_table
from worker.idempotency.keys import canonical_json, job_key, payload_hash, storage_key
from worker.idempotency.ledger import (
    CONFLICT_REASON,
    Claim,
    Ledger,
    Record,
    State,
    Status,
    decide_claim,
    parse_record,
)

__all__ = [
    "CONFLICT_REASON",
    "KEY_ATTRIBUTE",
    "TTL_ATTRIBUTE",
    "Claim",
    "DynamoDBStore",
    "Ledger",
    "Record",
    "State",
    "Status",
    "canonical_json",
    "create_table",
    "decide_claim",
    "job_key",
    "parse_record",
    "payload_hash",
    "storage_key",
]
