"""Prometheus for a group of worker processes (``WORKER_PROCESSES`` above 1 with ``WORKER_PROMETHEUS_PORT``).

prometheus-client's multiprocess mode, as under gunicorn: the supervisor makes an empty folder and gives its path
to every child as ``PROMETHEUS_MULTIPROC_DIR``; each child's metrics then live in memory-mapped files named by its
pid, and one scrape of the supervisor's ``/metrics`` merges every file of the folder. Why this and not scraping
each child's own ``/metrics`` and merging the text: a counter is in its file the moment it is incremented, so a
child killed by SIGKILL (or the OOM killer) loses nothing, where a scraper would lose whatever came after its last
look; and prometheus-client merges counters and histograms itself. The per-observer registries of
worker/observability/prometheus.py fit it: a child holds one PrometheusObserver, the files are keyed by metric,
labels and pid (not by registry), and the supervisor reads them into a registry of its own.

Merged: counters and histograms are summed over every process that ever ran, the dead ones included (their files
stay, so a restart never lowers a total); gauges say in their declaration how (``multiprocess_mode``):
``livesum`` for what adds up (in flight, free slots, stuck threads), ``liveall`` for what belongs to one process
(``sqs_worker_endpoint_up``), which gets a ``process`` label (the child's index: 0, 1, ...) in place of
prometheus-client's ``pid``. When a child exits, ``mark_process_dead`` drops its live gauges and its counter and
histogram files are added into one file per kind for all the dead (``counter_retired.db``): a child that crashes
again and again would otherwise add two files, and scrape time, at each restart.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.samples import Sample

from worker.observability.prometheus import CONTENT_TYPE, PrometheusObserver

#: The variable that puts prometheus-client in a child into multiprocess mode (read by prometheus-client itself).
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: The label that tells the processes of a group apart, on per-process gauges only.
PROCESS_LABEL = "process"
#: The kinds of file whose values are summed over every process, the dead ones included.
SUMMED_KINDS = ("counter", "histogram")


def relabel_processes(metric: Metric, process_of: Callable[[str], int | None]) -> Metric:
    """``metric`` with its ``pid`` label turned into ``process`` (the child's index); samples of a pid that is no
    longer a child of the group are left out (pure)."""
    samples = []
    for sample in metric.samples:
        if "pid" not in sample.labels:
            samples.append(sample)
            continue
        index = process_of(sample.labels["pid"])
        if index is None:
            continue
        labels = {name: value for name, value in sample.labels.items() if name != "pid"}
        labels[PROCESS_LABEL] = str(index)
        samples.append(Sample(sample.name, labels, sample.value, sample.timestamp, sample.exemplar))
    metric.samples = samples
    return metric


class GroupMetrics:
    """The folder of a group's metric files, and the supervisor's ``/metrics`` that merges them."""

    def __init__(self, queue: str) -> None:
        self.path = tempfile.mkdtemp(prefix="sqs-worker-metrics-")
        self._process_by_pid: dict[str, int] = {}
        self._families = _families_of(queue)
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def child_environment(self) -> dict[str, str]:
        """What a child's environment needs so that it writes its metrics in the group's folder."""
        return {MULTIPROC_DIR_ENV: self.path}

    def started(self, pid: int, index: int) -> None:
        self._process_by_pid[str(pid)] = index

    def exited(self, pid: int) -> None:
        """A child is gone: its live gauges go, its counters and histograms stay in the sums."""
        self._process_by_pid.pop(str(pid), None)
        mark_process_dead(pid, self.path)  # type: ignore[no-untyped-call]
        for kind in SUMMED_KINDS:
            fold(os.path.join(self.path, f"{kind}_{pid}.db"), into=os.path.join(self.path, f"{kind}_retired.db"))

    def collect(self) -> Iterator[Metric]:
        files = glob.glob(os.path.join(self.path, "*.db"))
        merged: dict[str, Metric] = {
            metric.name: relabel_processes(metric, self._process_by_pid.get)
            for metric in MultiProcessCollector.merge(files)  # type: ignore[no-untyped-call]
        }
        for name, (documentation, kind) in self._families.items():  # every family, sampled or not yet
            found = merged.pop(name, None)
            yield found if found is not None else Metric(name, documentation, kind)
        yield from merged.values()

    def render(self) -> str:
        return generate_latest(self.registry).decode("utf-8")

    def route(self) -> tuple[int, str, str]:
        return 200, CONTENT_TYPE, self.render()

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def fold(source: str, *, into: str) -> None:
    """Add the values of a dead process's file ``source`` to those of ``into`` and remove ``source``.

    The new ``into`` is written beside it and renamed over it; the scrape, in the same event loop, never sees a
    half-folded folder.
    """
    if not os.path.exists(source):
        return
    totals: dict[str, float] = {}
    for path in (into, source):
        if os.path.exists(path):
            for key, value, _, _ in MmapedDict.read_all_values_from_file(path):  # type: ignore[no-untyped-call]
                totals[key] = totals.get(key, 0.0) + value
    partial = into.removesuffix(".db") + ".partial"  # not *.db: never read by a scrape
    with contextlib.suppress(FileNotFoundError):
        os.unlink(partial)
    written = MmapedDict(partial)  # type: ignore[no-untyped-call]
    try:
        for key, value in totals.items():
            written.write_value(key, value, 0.0)  # type: ignore[no-untyped-call]
    finally:
        written.close()  # type: ignore[no-untyped-call]
    os.replace(partial, into)
    os.unlink(source)


def _families_of(queue: str) -> dict[str, tuple[str, str]]:
    """Name -> (help, type) of every family a worker declares, in its order (a scrape before the first job still
    lists them all, as one process's does)."""
    return {metric.name: (metric.documentation, metric.type) for metric in PrometheusObserver(queue).registry.collect()}
