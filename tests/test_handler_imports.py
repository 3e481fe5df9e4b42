"""WORKER_HANDLERS imports as Celery, arq and uvicorn users expect: from the current folder, without PYTHONPATH,
whether ``sqs-worker`` runs as its console script or with ``python -m``; a module that shadows the ``worker``
package, is missing or raises on import is one line and exit 2."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.support.backends import Backend

SCRIPT = Path(sys.executable).with_name("sqs-worker")
HANDLERS = """
from worker import job

@job("imported_from_cwd", max_attempts=9)
async def imported_from_cwd(payload: dict) -> None:
    pass
"""
#: How a user starts the worker: the console script on PATH, or the module with the venv's Python.
STARTS = {"console script": [str(SCRIPT)], "python -m": [sys.executable, "-m", "worker.commands"]}


def project(tmp_path: Path, files: dict[str, str]) -> Path:
    folder = tmp_path / "project"
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return folder


def sqs_worker(
    start: list[str], *args: str, cwd: Path, endpoint_url: str = "http://127.0.0.1:9", **variables: str
) -> subprocess.CompletedProcess[str]:
    """Run a command as a user would from ``cwd``: no PYTHONPATH, only the AWS and WORKER variables given."""
    env = {
        "PATH": f"{SCRIPT.parent}:/usr/bin:/bin",
        "HOME": str(cwd),
        "AWS_ENDPOINT_URL": endpoint_url,
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        **variables,
    }
    return subprocess.run([*start, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("start", STARTS.values(), ids=STARTS.keys())
def test_handlers_import_from_the_current_folder_without_pythonpath(
    start: list[str], tmp_path: Path, moto_backend: Backend
) -> None:
    folder = project(tmp_path, {"app/jobs.py": HANDLERS})  # a namespace package: no __init__.py needed
    queue = f"imports-{uuid.uuid4().hex[:8]}"
    result = sqs_worker(
        start,
        "bootstrap",
        cwd=folder,
        endpoint_url=moto_backend.endpoint_url,
        WORKER_QUEUE=queue,
        WORKER_HANDLERS="app.jobs",
    )
    assert result.returncode == 0, result.stderr
    assert "maxReceiveCount 11" in result.stdout  # the imported handler's max_attempts (9) + 2


@pytest.mark.parametrize("shadow", ["worker.py", "worker/__init__.py"])
def test_a_worker_module_in_the_current_folder_is_one_line_and_exit_2(shadow: str, tmp_path: Path) -> None:
    folder = project(tmp_path, {shadow: "print('the user module ran')\n", "app/jobs.py": HANDLERS})
    result = sqs_worker(STARTS["console script"], "run", cwd=folder, WORKER_QUEUE="q", WORKER_HANDLERS="app.jobs")
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()
    shown = folder / shadow.removesuffix("/__init__.py")
    assert line == (
        f"sqs-worker: error: {shown} shadows the sqs-worker package 'worker' "
        "(handlers import it: from worker import job): rename your module"
    )
    assert "the user module ran" not in result.stdout


def test_a_folder_named_worker_without_init_does_not_shadow(tmp_path: Path, moto_backend: Backend) -> None:
    folder = project(tmp_path, {"worker/notes.txt": "not a package", "app/jobs.py": HANDLERS})
    result = sqs_worker(
        STARTS["console script"],
        "bootstrap",
        cwd=folder,
        endpoint_url=moto_backend.endpoint_url,
        WORKER_QUEUE=f"imports-{uuid.uuid4().hex[:8]}",
        WORKER_HANDLERS="app.jobs",
    )
    assert result.returncode == 0, result.stderr


def test_a_missing_handler_module_is_one_line_and_exit_2(tmp_path: Path) -> None:
    folder = project(tmp_path, {"app/jobs.py": HANDLERS})
    result = sqs_worker(STARTS["console script"], "run", cwd=folder, WORKER_QUEUE="q", WORKER_HANDLERS="app.job")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"sqs-worker: error: WORKER_HANDLERS: no module 'app.job' (looked in {folder} and the installed packages; "
        "run the worker from the folder that holds it, or install it)"
    ]


def test_a_handler_module_that_raises_is_one_line_and_its_traceback_only_at_debug(tmp_path: Path) -> None:
    folder = project(tmp_path, {"app/jobs.py": "import json\n\nraise RuntimeError('no mail\\nserver configured')\n"})
    result = sqs_worker(STARTS["console script"], "run", cwd=folder, WORKER_QUEUE="q", WORKER_HANDLERS="app.jobs")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "sqs-worker: error: WORKER_HANDLERS: importing 'app.jobs' failed: RuntimeError: no mail server configured "
        f"({folder / 'app' / 'jobs.py'}, line 3)"
    ]
    debug = sqs_worker(
        STARTS["console script"],
        "run",
        cwd=folder,
        WORKER_QUEUE="q",
        WORKER_HANDLERS="app.jobs",
        WORKER_LOG_LEVEL="DEBUG",
        WORKER_LOG_FORMAT="text",
    )
    assert debug.returncode == 2
    assert "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.splitlines()[-1] == result.stderr.splitlines()[0]


def test_a_missing_dependency_of_a_handler_module_names_both(tmp_path: Path) -> None:
    folder = project(tmp_path, {"app/jobs.py": "import no_such_mail_library\n"})
    result = sqs_worker(STARTS["console script"], "run", cwd=folder, WORKER_QUEUE="q", WORKER_HANDLERS="app.jobs")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "sqs-worker: error: WORKER_HANDLERS: importing 'app.jobs' failed: ModuleNotFoundError: "
        f"No module named 'no_such_mail_library' ({folder / 'app' / 'jobs.py'}, line 1)"
    ]
