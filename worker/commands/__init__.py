"""The CLI's commands: one module each (see ``worker.commands.__main__``)."""

from __future__ import annotations


def plain_help(doc: str | None) -> str:
    """A module docstring as ``--help`` text: plain text, without reST's double backticks."""
    return (doc or "").replace("``", "")
