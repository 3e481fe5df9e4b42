"""The ``dynamodb:moto`` provider: every operation falls through to moto, item writes under one lock."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from localstack.aws.api.dynamodb import DynamodbApi
from localstack.services.plugins import Service, aws_provider

#: moto DynamoDBBackend methods that write items; each runs under one process-wide lock. The PartiQL
#: entry points are included because they can write too. BatchWriteItem calls put_item/delete_item.
WRITE_METHODS = (
    "put_item",
    "update_item",
    "delete_item",
    "transact_write_items",
    "execute_statement",
    "execute_transaction",
    "batch_execute_statement",
)
_install_lock = threading.Lock()
_installed = False


class MotoDynamoDBProvider(DynamodbApi):
    """Implements nothing itself: LocalStack's MotoFallbackDispatcher sends each operation to moto."""


def serialise_item_writes() -> None:
    """Wrap moto's DynamoDB item writes in one re-entrant lock; idempotent."""
    global _installed
    with _install_lock:
        if _installed:
            return
        from moto.dynamodb.models import DynamoDBBackend

        lock = threading.RLock()
        for name in WRITE_METHODS:
            original = getattr(DynamoDBBackend, name, None)
            if original is not None:
                setattr(DynamoDBBackend, name, _locked(original, lock))
        _installed = True


def _locked(method: Callable[..., Any], lock: threading.RLock) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return method(*args, **kwargs)

    return wrapper


@aws_provider(api="dynamodb", name="moto")
def dynamodb_moto() -> Service:
    from localstack.services.moto import MotoFallbackDispatcher

    serialise_item_writes()
    return Service.for_provider(MotoDynamoDBProvider(), dispatch_table_factory=MotoFallbackDispatcher)
