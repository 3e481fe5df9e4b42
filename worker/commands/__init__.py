"""The CLI's commands: one module each (see ``worker.cli``)."""

from __future__ import annotations


def plain_help(doc: str | None) -> str:
    """A module docstring as ``--help`` text: plain text, without reST's double backticks."""
    return (doc or "").replace("``", "")
