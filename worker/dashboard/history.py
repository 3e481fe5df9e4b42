"""What the dashboard samples while it runs (pure: values in, values out): each queue's depth for its sparkline,
and jobs succeeded, retried and dead-lettered per minute, from the counts the workers' presence items carry
(differences between two samples of the same worker), or from the growth of the DLQ when no worker reports.
Kept for the last hour only."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

WINDOW_S = 3600
KINDS = ("succeeded", "retried", "dead_lettered")


@dataclass
class History:
    depth: dict[str, deque[tuple[int, int]]] = field(default_factory=dict)  # queue name -> (epoch s, depth)
    per_minute: dict[int, Counter[str]] = field(default_factory=dict)  # minute start (epoch s) -> counts
    _worker_counts: dict[str, dict[str, int]] = field(default_factory=dict)
    _dlq_visible: int | None = None

    def sample_depth(self, name: str, depth: int, *, now_s: int) -> None:
        points = self.depth.setdefault(name, deque())
        points.append((now_s, depth))
        while points and points[0][0] < now_s - WINDOW_S:
            points.popleft()

    def sample_workers(self, counts_by_worker: Mapping[str, Mapping[str, int]], *, now_s: int) -> bool:
        """Add what each worker did since its last sample; True when any worker reported."""
        minute = self._minute(now_s)
        for owner, counts in counts_by_worker.items():
            before = self._worker_counts.get(owner)
            if before is not None:
                for kind in KINDS:
                    minute[kind] += max(0, counts.get(kind, 0) - before.get(kind, 0))
            self._worker_counts[owner] = dict(counts)
        return bool(counts_by_worker)

    def sample_dlq(self, visible: int, *, now_s: int, count_dead_letters: bool) -> None:
        """The DLQ's growth counts as dead-lettered jobs when no worker reports its own counts."""
        if count_dead_letters and self._dlq_visible is not None and visible > self._dlq_visible:
            self._minute(now_s)["dead_lettered"] += visible - self._dlq_visible
        self._dlq_visible = visible

    def _minute(self, now_s: int) -> Counter[str]:
        start = now_s - now_s % 60
        for old in [m for m in self.per_minute if m < start - WINDOW_S]:
            del self.per_minute[old]
        return self.per_minute.setdefault(start, Counter())

    def series(self, *, now_s: int) -> dict[str, list[tuple[int, float]]]:
        """Per kind, (minute start, count) for each minute of the last hour sampled so far."""
        minutes = sorted(m for m in self.per_minute if m >= now_s - WINDOW_S)
        return {kind: [(m, float(self.per_minute[m][kind])) for m in minutes] for kind in KINDS}


def columns(series: Mapping[str, Iterable[tuple[int, float]]]) -> dict[str, list[float]]:
    """uPlot's column layout: one time axis and one column per kind (missing minutes as 0)."""
    times = sorted({t for points in series.values() for t, _ in points})
    lookup = {kind: dict(points) for kind, points in series.items()}
    out: dict[str, list[float]] = {"t": [float(t) for t in times]}
    for kind in KINDS:
        out[kind] = [lookup.get(kind, {}).get(t, 0.0) for t in times]
    return out
