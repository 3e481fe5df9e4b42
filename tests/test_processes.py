"""WORKER_PROCESSES: ``sqs-worker run`` as a supervisor of worker processes, run as a real process.

Both processes consume; SIGTERM reaches all, jobs in flight finish and the supervisor exits after the last; a
SIGKILLed child is started again; /healthz and /readyz answer for the whole group.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.backends import Backend
from tests.support.harness import sqs_client
from tests.support.process import ROOT, cli, lines, start, wait_until, worker_env
from tests.support.queues import assert_queue_empty
from worker.dev.localaws import free_port
from worker.observability.health import HealthStatus
from worker.runtime.supervisor import (
    cpus_from_cgroup,
    group_status,
    resolve_processes,
    restart_delay_s,
    silent_reason,
    usable_cpus,
)


def group(backend: Backend, tmp_path: Path, **settings: str) -> tuple[dict[str, str], str]:
    queue = f"group-{uuid.uuid4().hex[:8]}"
    env = worker_env(
        backend.endpoint_url,
        WORKER_QUEUE=queue,
        WORKER_HANDLERS="tests.support.group_handlers",
        WORKER_PROCESSES="2",
        TEST_EFFECTS_FILE=str(tmp_path / "effects.txt"),
        TMP=str(tmp_path),
        **settings,
    )
    result = cli("bootstrap", env=env)
    assert result.returncode == 0, result.stderr
    return env, sqs_client(backend.endpoint_url).get_queue_url(QueueName=queue)["QueueUrl"]


def send(backend: Backend, url: str, numbers: range, seconds: float) -> None:
    client = sqs_client(backend.endpoint_url)
    for n in numbers:
        body = {"type": "where", "payload": {"n": n, "seconds": seconds}}
        client.send_message(QueueUrl=url, MessageBody=json.dumps(body))


def effects(tmp_path: Path, kind: str) -> dict[int, int]:
    """Job number -> pid of the process that recorded ``kind`` (start or end) for it."""
    out = {}
    for line in lines(tmp_path / "effects.txt"):
        word, n, pid = line.split()
        if word == kind:
            out[int(n)] = int(pid)
    return out


def children(pid: int) -> set[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return set()
    return {int(child) for child in text.split()}


def running(pid: int) -> bool:
    """Whether ``pid`` runs (an orphan that exited stays a zombie until init reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except OSError:
        return 0, {}


def stop(worker: subprocess.Popen[bytes], log: Path) -> None:
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            assert worker.wait(timeout=60) == 0, log.read_text()
        finally:
            if worker.poll() is None:
                worker.kill()


def test_both_processes_consume_and_sigterm_finishes_their_jobs(backend: Backend, tmp_path: Path) -> None:
    env, url = group(backend, tmp_path, WORKER_CONCURRENCY="2", WORKER_SHUTDOWN_GRACE_S="30")
    log = tmp_path / "worker.log"
    worker = start("run", env=env, stderr_path=log)
    try:
        wait_until(lambda: len(children(worker.pid)) == 2, 60, "two worker processes")
        pids = children(worker.pid)
        # Four slots in all: 4 jobs of 3 s keep both processes busy at once, so each must take some.
        send(backend, url, range(4), seconds=3)
        wait_until(lambda: len(effects(tmp_path, "start")) == 4, 60, "all four jobs to start")
        assert set(effects(tmp_path, "start").values()) == pids, lines(tmp_path / "effects.txt")
        worker.send_signal(signal.SIGTERM)  # every job is mid-sleep: each must finish before its process exits
        assert worker.wait(timeout=60) == 0, log.read_text()
    finally:
        stop(worker, log)
    assert effects(tmp_path, "end") == effects(tmp_path, "start")
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()], "a child outlived the supervisor"
    assert_queue_empty(sqs_client(backend.endpoint_url), url)


def start_own_group(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``sqs-worker run`` in a process group of its own, as a terminal's foreground job."""
    with log.open("wb") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "worker.commands", "run"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            cwd=ROOT,
            start_new_session=True,
        )


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "systemd-stop"])
def test_a_signal_to_the_whole_process_group_still_lets_running_jobs_finish(
    backend: Backend, tmp_path: Path, signum: int
) -> None:
    """Ctrl-C in a terminal, systemd's stop or ``timeout`` signal every process of the group: each child gets the
    signal directly and again from the supervisor, which is one signal, not a second (that exits at once)."""
    env, url = group(backend, tmp_path, WORKER_CONCURRENCY="1", WORKER_SHUTDOWN_GRACE_S="30")
    log = tmp_path / "worker.log"
    worker = start_own_group(env, log)
    try:
        wait_until(lambda: len(children(worker.pid)) == 2, 60, "two worker processes")
        send(backend, url, range(2), seconds=3)
        wait_until(lambda: len(effects(tmp_path, "start")) == 2, 60, "both jobs to start")
        os.killpg(worker.pid, signum)
        assert worker.wait(timeout=60) == 0, log.read_text()
    finally:
        stop(worker, log)
    assert "exiting at once" not in log.read_text()
    assert effects(tmp_path, "end") == effects(tmp_path, "start")  # both finished within the grace
    assert_queue_empty(sqs_client(backend.endpoint_url), url)


def test_a_starved_supervisors_late_copy_of_the_group_signal_is_not_a_second_signal(
    backend: Backend, tmp_path: Path
) -> None:
    """The group's signal reaches the processes at once and the supervisor's copy as late as the supervisor gets
    the CPU (here: held stopped for a second): the processes took their stop signal already, and the copy must not
    cut their jobs short."""
    env, url = group(backend, tmp_path, WORKER_CONCURRENCY="1", WORKER_SHUTDOWN_GRACE_S="30")
    log = tmp_path / "worker.log"
    worker = start_own_group(env, log)
    try:
        wait_until(lambda: len(children(worker.pid)) == 2, 60, "two worker processes")
        send(backend, url, range(2), seconds=6)
        wait_until(lambda: len(effects(tmp_path, "start")) == 2, 60, "both jobs to start")
        os.kill(worker.pid, signal.SIGSTOP)
        try:
            os.killpg(worker.pid, signal.SIGTERM)  # the supervisor's copy waits until it runs again
            wait_until(lambda: log.read_text().count("SIGTERM received: shutting down") == 2, 10, "both to stop")
            time.sleep(1.0)  # the scenario: the supervisor's copy comes a second after the processes took theirs
        finally:
            os.kill(worker.pid, signal.SIGCONT)
        assert worker.wait(timeout=60) == 0, log.read_text()
    finally:
        stop(worker, log)
    assert "exiting at once" not in log.read_text()
    assert effects(tmp_path, "end") == effects(tmp_path, "start")  # both finished within the grace
    assert_queue_empty(sqs_client(backend.endpoint_url), url)


def test_once_the_supervisor_is_gone_a_second_sigterm_ends_a_process_at_once(backend: Backend, tmp_path: Path) -> None:
    """A SIGKILLed supervisor's processes get SIGTERM from the kernel and finish their jobs; with no supervisor to
    pass signals on, a repeat is a second signal again, as for one process."""
    env, url = group(backend, tmp_path, WORKER_CONCURRENCY="1", WORKER_SHUTDOWN_GRACE_S="60")
    log = tmp_path / "worker.log"
    worker = start("run", env=env, stderr_path=log)
    pids: set[int] = set()
    try:
        wait_until(lambda: len(children(worker.pid)) == 2, 60, "two worker processes")
        pids = children(worker.pid)
        send(backend, url, range(2), seconds=30)
        wait_until(lambda: len(effects(tmp_path, "start")) == 2, 60, "both jobs to start")
        worker.kill()
        worker.wait(timeout=10)
        wait_until(lambda: log.read_text().count("SIGTERM received: shutting down") == 2, 10, "both to stop")
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not [pid for pid in pids if running(pid)], 10, "both to exit at once")
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert log.read_text().count("second SIGTERM: exiting at once") == 2, log.read_text()
    assert effects(tmp_path, "end") == {}  # cut short, not waited for


def test_a_second_sigterm_ends_the_group_at_once_with_143(backend: Backend, tmp_path: Path) -> None:
    """As one process does: the second signal is passed on, the children exit at once, the group exits 128 + 15."""
    env, url = group(backend, tmp_path, WORKER_CONCURRENCY="1", WORKER_SHUTDOWN_GRACE_S="60")
    log = tmp_path / "worker.log"
    worker = start("run", env=env, stderr_path=log)
    try:
        wait_until(lambda: len(children(worker.pid)) == 2, 60, "two worker processes")
        send(backend, url, range(2), seconds=30)
        wait_until(lambda: len(effects(tmp_path, "start")) == 2, 60, "both jobs to start")
        worker.send_signal(signal.SIGTERM)
        wait_until(lambda: "stopping 2 worker processes" in log.read_text(), 10, "the first signal to be handled")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=20) == 128 + signal.SIGTERM, log.read_text()
    finally:
        stop(worker, log)
    assert effects(tmp_path, "end") == {}  # cut short, not waited for


def test_a_killed_child_is_restarted_and_health_answers_for_the_group(backend: Backend, tmp_path: Path) -> None:
    port = free_port()
    env, url = group(backend, tmp_path, WORKER_HEALTH_PORT=str(port), WORKER_CONCURRENCY="2")
    log = tmp_path / "worker.log"
    worker = start("run", env=env, stderr_path=log)
    try:
        wait_until(lambda: get(port, "/readyz")[0] == 200, 60, "the group to be ready")
        status, body = get(port, "/healthz")
        assert status == 200 and [p["status"] for p in body["processes"]] == ["ok", "ok"], body
        first = children(worker.pid)
        victim = min(first)
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: get(port, "/readyz")[0] == 503, 10, "the group to report the dead child")
        wait_until(lambda: len(children(worker.pid) - first) == 1, 30, "the child to be started again")
        wait_until(lambda: get(port, "/readyz")[0] == 200, 60, "the group to be ready again")
        assert "exited with -9" in log.read_text()
        # The supervisor answers from outside; each process only on loopback (for the supervisor's probes).
        serving = [line for line in log.read_text().splitlines() if "serving /healthz" in line]
        assert any(f"0.0.0.0:{port}" in line for line in serving), serving
        children_serving = [line for line in serving if f":{port}" not in line]
        assert len(children_serving) >= 3 and all("on 127.0.0.1:" in line for line in children_serving), serving
        send(backend, url, range(6), seconds=0)
        wait_until(lambda: len(effects(tmp_path, "end")) == 6, 60, "the jobs after the restart")
    finally:
        stop(worker, log)
    assert get(port, "/healthz")[0] == 0  # the group is gone, its port closed
    assert_queue_empty(sqs_client(backend.endpoint_url), url)


def test_a_configuration_error_in_the_children_stops_the_group_with_2(tmp_path: Path) -> None:
    env = worker_env("http://127.0.0.1:9", TMP=str(tmp_path), WORKER_QUEUE="q", WORKER_PROCESSES="2")
    result = cli("run", env=env, timeout_s=60)  # no handlers: each child refuses to start
    assert result.returncode == 2, result.stderr
    assert "no job handlers registered" in result.stderr


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [("max 100000", None), ("200000 100000", 2), ("150000 100000", 2), ("50000 100000", 1), ("", None), ("x y", None)],
)
def test_cgroup_quota_in_cpus(cpu_max: str, expected: int | None) -> None:
    assert cpus_from_cgroup(cpu_max) == expected


def test_usable_cpus_and_auto() -> None:
    assert usable_cpus(affinity=8, cgroup_cpus=2) == 2
    assert usable_cpus(affinity=2, cgroup_cpus=None) == 2
    assert usable_cpus(affinity=1, cgroup_cpus=4) == 1
    assert resolve_processes("auto", cpus=lambda: 3) == 3
    assert resolve_processes("4", cpus=lambda: 1) == 4


def test_restart_backoff_doubles_to_a_cap() -> None:
    assert [restart_delay_s(failures=n) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert restart_delay_s(failures=30) == 30.0


def test_a_silent_child_is_starting_until_it_first_answers_then_maybe_blocked() -> None:
    assert silent_reason(0.0, 0.0, 3.2) == "its health endpoint does not answer yet (started 3 s ago)"
    assert silent_reason(100.0, 90.0, 104.0) == "its health endpoint does not answer yet (started 4 s ago)"  # restarted
    assert silent_reason(100.0, 110.0, 122.0) == (
        "its health endpoint has not answered for 12 s (is its event loop blocked?)"
    )


def test_group_status_is_ok_only_when_every_member_is() -> None:
    ok, bad = HealthStatus(True, "ready", {}), HealthStatus(False, "unreachable: sqs", {})
    assert group_status([(0, ok), (1, ok)], "are ready").ok
    failing = group_status([(0, ok), (1, bad)], "are ready")
    assert not failing.ok and failing.reason == "process 1: unreachable: sqs"
    assert not group_status([], "are ready").ok


async def test_a_signal_while_a_child_is_being_started_reaches_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM while the supervisor was starting a child (the container's stop right after its start, or a
    restart): the signal went to the children already running, so the new one took jobs until it was killed at
    the grace's end (its jobs ran again) and the group exited 1. Now it is told at once, as the others were."""
    import asyncio
    import time

    from worker.runtime.supervisor import Supervisor
    from worker.settings import WorkerSettings

    settings = WorkerSettings(queue="q", shutdown_grace_s=30, health_file=str(tmp_path / "health"))
    child = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\ntime.sleep(120)\n"
    supervisor = Supervisor(settings, 1, command=[sys.executable, "-c", child])
    spawn = asyncio.create_subprocess_exec

    async def signalled_while_spawning(*args: Any, **kwargs: Any) -> Any:
        supervisor._on_signal(signal.SIGTERM)  # the signal comes in while this child is being started
        return await spawn(*args, **kwargs)

    monkeypatch.setattr(asyncio, "create_subprocess_exec", signalled_while_spawning)
    started = time.monotonic()
    async with asyncio.timeout(settings.shutdown_grace_s):  # before the fix: killed at grace + 15 s, exit 1
        code = await supervisor.run()
    assert code == 0
    assert time.monotonic() - started < 10


async def test_a_restarted_child_gets_ports_of_its_own_when_its_old_one_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child's loopback health port was picked once and kept: taken by another process while the child was
    down, its restart could not listen (exit 2, as any taken port) and the supervisor stopped the whole group with
    2 as a configuration error."""
    import asyncio
    import socket

    from worker.runtime.supervisor import Supervisor
    from worker.settings import WorkerSettings

    settings = WorkerSettings(
        queue="q", shutdown_grace_s=5, health_file=str(tmp_path / "health"), health_port=free_port()
    )
    crashed, up = tmp_path / "crashed", tmp_path / "up"
    child = (  # listens on its port as a worker does (exit 2 when taken); crashes at its first start
        "import os, pathlib, signal, socket, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
        "listener = socket.socket()\n"
        "try:\n"
        "    listener.bind(('127.0.0.1', int(os.environ['WORKER_HEALTH_PORT'])))\n"
        "except OSError:\n"
        "    sys.exit(2)\n"
        f"crashed, up = pathlib.Path({str(crashed)!r}), pathlib.Path({str(up)!r})\n"
        "if not crashed.exists():\n"
        "    crashed.write_text('once')\n"
        "    sys.exit(1)\n"
        "up.write_text('up')\n"
        "time.sleep(120)\n"
    )
    supervisor = Supervisor(settings, 1, command=[sys.executable, "-c", child])
    spawn = asyncio.create_subprocess_exec
    ports: list[int] = []
    holder = socket.socket()

    async def recording(*args: Any, **kwargs: Any) -> Any:
        port = int(kwargs["env"]["WORKER_HEALTH_PORT"])
        if ports:  # the restart: another process has taken the port of the first start meanwhile
            holder.bind(("127.0.0.1", ports[0]))
            holder.listen()
        ports.append(port)
        return await spawn(*args, **kwargs)

    async def stop_once_up() -> None:  # the restarted child's effect: another process, no event to await
        await asyncio.to_thread(wait_until, lambda: up.exists() or supervisor.stop.is_set(), 20, "the restart")
        supervisor._on_signal(signal.SIGTERM)

    monkeypatch.setattr(asyncio, "create_subprocess_exec", recording)
    try:
        async with asyncio.timeout(30):
            code, _ = await asyncio.gather(supervisor.run(), stop_once_up())
    finally:
        holder.close()
    assert code == 0
    assert len(ports) == 2
    assert ports[1] != ports[0]
