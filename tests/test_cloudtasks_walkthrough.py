"""The README's "Try it locally" of Google Cloud Tasks, run as written: the emulator started in this checkout
from its virtualenv, then in a fresh project folder with ``./scripts/dev``'s exports pasted: bootstrap,
serve-tasks, enqueue; the job runs. Only the two ports are swapped for free ones (other sessions share the host)."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest

from tests.support.cloudtasks import EMULATOR_VENV
from tests.support.process import wait_until
from tests.test_readme_examples import ROOT, dev_server, readme_blocks, run_bash  # noqa: F401 (dev_server: a fixture)
from worker.dev.localaws import free_port

pytestmark = pytest.mark.skipif(
    not (EMULATOR_VENV / "bin" / "python").exists(), reason="no emulator venv: bash infra/cloudtasks/setup.sh"
)


def block_starting(prefix: str) -> str:
    (block,) = [b.text for b in readme_blocks() if b.language == "bash" and b.first_line.startswith(prefix)]
    return block


def stop(pid_file: Path) -> None:
    for pid in pid_file.read_text().split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGTERM)


def test_the_cloud_tasks_walkthrough_runs_as_written(dev_server: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    emulator_port, serve_port = free_port(), free_port()
    emulator_log = tmp_path / "emulator.log"
    emulator = (
        block_starting("bash infra/cloudtasks/setup.sh")
        .replace("9123", str(emulator_port))
        .replace("/tmp/cloudtasks-emulator.log", str(emulator_log))
    )
    project = block_starting("export WORKER_BACKEND=cloudtasks").replace("9123", str(emulator_port))
    project = project.replace("8085", str(serve_port))
    folder = tmp_path / "project"
    (folder / "app").mkdir(parents=True)
    (handlers,) = [b.text for b in readme_blocks() if b.first_line == "# app/jobs.py"]
    (folder / "app" / "jobs.py").write_text(handlers)
    emulator_pids, project_pids = tmp_path / "emulator.pids", tmp_path / "project.pids"
    env = {**dev_server, "PATH": f"{ROOT / '.tools' / 'uv' / 'bin'}:{dev_server['PATH']}"}  # setup.sh's uv
    try:
        run_bash(f"cd {ROOT}\n{emulator}\njobs -p >{emulator_pids}", env, cwd=tmp_path)  # in the checkout
        env = run_bash(f"{project}\njobs -p >{project_pids}", env, cwd=folder, timeout_s=90)
        log = folder / "serve-tasks.log"
        wait_until(lambda: '"event": "succeeded"' in log.read_text(), 30, "the walkthrough's job to run")
        succeeded = [line for line in log.read_text().splitlines() if '"event": "succeeded"' in line]
        assert len(succeeded) == 1 and '"job_type": "send_email"' in succeeded[0], succeeded
        (python,) = [b.text for b in readme_blocks() if b.first_line.startswith("from worker.backends.cloudtasks.")]
        user = {**env, "PATH": dev_server["PATH"]}  # the user's shell: not the uv the setup script was given
        run_bash(f"python - <<'README_PYTHON'\n{python}README_PYTHON", user, cwd=folder)  # the Producers snippet
        wait_until(lambda: log.read_text().count('"event": "succeeded"') == 2, 30, "the Python producer's job to run")
        warned = [line for line in log.read_text().splitlines() if '"level": "WARNING"' in line]
        assert warned == []  # no dispatch-deadline warning for the README's handlers with the defaults
        run_bash("sqs-worker dlq list >dlq.txt", env, cwd=folder)
        assert "dead letters read: 0" in (folder / "dlq.txt").read_text()
    finally:
        for pids in (project_pids, emulator_pids):
            if pids.is_file():
                stop(pids)
