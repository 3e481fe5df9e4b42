"""The side channel both benchmarked workers write: one line per job run, ``<sent_at> <started_at>`` (epoch s).

Standard library only, so the sqs-worker handlers (project venv) and the Celery task (.tools/celery-venv) record
a job with the same code: open the file named by ``BENCH_EFFECTS_FILE`` in append mode, write one short line.
Lines under PIPE_BUF written with O_APPEND do not interleave across threads or processes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

EFFECTS_ENV = "BENCH_EFFECTS_FILE"


def record(sent_at: float) -> None:
    """Note that a job sent at ``sent_at`` started now."""
    started_at = time.time()
    with Path(os.environ[EFFECTS_ENV]).open("a", encoding="ascii") as handle:
        handle.write(f"{sent_at:.6f} {started_at:.6f}\n")


def read(path: Path) -> list[tuple[float, float]]:
    """Every (sent_at, started_at) recorded so far; a line still being written is skipped."""
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        return []
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            rows.append((float(parts[0]), float(parts[1])))
    return rows


def count(path: Path) -> int:
    """Lines recorded so far (cheap: counts newlines)."""
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0
