"""The CLI's commands: one module each (see ``worker.commands.__main__``)."""

from __future__ import annotations

#: Exit code of a command that found nothing by the name it was given (a ledger record, a dead letter, a breaker).
NOT_FOUND_EXIT = 3


def plain_help(doc: str | None) -> str:
    """A module docstring as ``--help`` text: plain text, without reST's double backticks."""
    return (doc or "").replace("``", "")
