"""Which of the configured queues a command works on: ``--queue NAME`` picks one of WORKER_QUEUES (or the one
WORKER_QUEUE); without it, every queue of the set."""

from __future__ import annotations

import argparse

from worker.errors import ConfigError
from worker.names import queue_name_of
from worker.settings import WorkerSettings


def add_queue_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--queue", metavar="NAME", default=None, help=f"one queue of WORKER_QUEUES (default: {what})")


def selected_queues(settings: WorkerSettings, name: str | None) -> list[str]:
    """The queue names or URLs to work on, highest priority first: the one ``name`` picks, else all of them."""
    configured = [spec.queue for spec in settings.queue_set()]
    if name is None:
        return configured
    chosen = [queue for queue in configured if queue_name_of(queue) == queue_name_of(name)]
    if not chosen:
        names = ", ".join(queue_name_of(queue) for queue in configured)
        raise ConfigError(f"--queue {name}: not a configured queue (WORKER_QUEUES/WORKER_QUEUE: {names})")
    return chosen


def one_queue(settings: WorkerSettings, name: str | None, command: str) -> str:
    """The single queue a command acts on: ``--queue``, or the only one configured."""
    chosen = selected_queues(settings, name)
    if len(chosen) > 1:
        names = ", ".join(queue_name_of(queue) for queue in chosen)
        raise ConfigError(f"{command}: WORKER_QUEUES names several queues ({names}): pick one with --queue NAME")
    return chosen[0]
