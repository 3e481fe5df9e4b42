"""The README's examples run as written, as a new user runs them: ``sqs-worker dev`` in one shell (started here
with no AWS variables at all), its ``export`` lines pasted into another, then every fenced ``bash`` and
``python`` block of README.md in order, in a fresh project folder. A block this test does not know how to run
fails it: make the example runnable, or list it below with the reason."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.support.process import wait_until
from worker.envelope import parse_envelope

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SCRIPT = Path(sys.executable).with_name("sqs-worker")
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"  # a new shell: the venv is not on PATH until the banner's export

#: Blocks not run as written, by their first line, and why.
NOT_RUN = {
    "./scripts/dev     # set up, then run the worker on an embedded local AWS (no account, no Docker); "
    "Ctrl-C stops it": (
        "./scripts/dev sets up the venv, then execs `sqs-worker dev` (checked below), which this test runs; "
        "./scripts/test runs the whole suite, this test among it"
    ),
    "PROJECT=my-project REGION=europe-west1 IMAGE=europe-west1-docker.pkg.dev/my-project/jobs/worker:1": (
        "deploys to Google Cloud (gcloud, a project); its retry flags are checked against queue_retry_config by "
        "tests/test_cloudtasks_units.py, the service's settings by the same test"
    ),
    "bash infra/cloudtasks/setup.sh   # once; does nothing when the virtualenv is up to date": (
        "the Cloud Tasks emulator, run in this checkout: tests/test_cloudtasks_walkthrough.py runs it as written"
    ),
    "export WORKER_BACKEND=cloudtasks WORKER_QUEUE=projects/local/locations/here/queues/jobs "
    "WORKER_HANDLERS=app.jobs": ("needs the emulator above: tests/test_cloudtasks_walkthrough.py runs it as written"),
    "from worker.backends.cloudtasks.producer import enqueue_task, tasks_client": (
        "needs the emulator and the Cloud Tasks exports: tests/test_cloudtasks_walkthrough.py runs it as written"
    ),
}
#: Commands that run until a signal: started in the background, stopped (SIGTERM) after the other examples.
BACKGROUND = {
    "sqs-worker run",
    "sqs-worker dashboard --port 8282",
    "WORKER_QUEUE=flows WORKER_HANDLERS=app.flows sqs-worker run",
}
#: Inline commands of the README's prose that are run too, after the fenced blocks (not the CLI table's synopses).
INLINE_COMMANDS = re.compile(r"`(sqs-worker enqueue \w+ --payload '[^`']+')`")


@dataclass
class Block:
    language: str
    text: str
    line: int

    @property
    def first_line(self) -> str:
        return self.text.splitlines()[0] if self.text else ""


def readme_blocks() -> list[Block]:
    blocks = []
    for match in re.finditer(r"^```(\w*)\n(.*?)^```$", README.read_text(), flags=re.MULTILINE | re.DOTALL):
        line = README.read_text()[: match.start()].count("\n") + 1
        blocks.append(Block(match.group(1), match.group(2), line))
    return blocks


@pytest.fixture
def dev_server(tmp_path: Path) -> Iterator[dict[str, str]]:
    """``sqs-worker dev --no-demo`` as ./scripts/dev runs it (from the checkout), with no AWS variables set;
    yields the environment of a new shell after pasting the banner's ``export`` lines."""
    home = tmp_path / "home"
    home.mkdir()
    shell = {"PATH": BASE_PATH, "HOME": str(home), "LANG": "C.UTF-8"}
    log_path = tmp_path / "dev.log"
    with log_path.open("wb") as log:
        dev = subprocess.Popen([str(SCRIPT), "dev", "--no-demo"], cwd=ROOT, env=shell, stdout=log, stderr=log)
    try:
        wait_until(lambda: "Stop with Ctrl-C." in log_path.read_text(), 60, "the dev banner")
        exports = banner_exports(log_path.read_text())
        # `sqs-worker dev` starts the dashboard beside the worker and prints its URL
        wait_until(lambda: "dashboard at http://127.0.0.1:" in log_path.read_text(), 30, "the dev dashboard")
        dashboard = re.search(r"dashboard at (http://\S+)", log_path.read_text())
        assert dashboard is not None
        with urllib.request.urlopen(dashboard.group(1), timeout=10) as page:
            assert "Overview" in page.read().decode()
        yield run_bash(exports, shell, cwd=home)
    finally:
        dev.send_signal(signal.SIGINT)
        code = dev.wait(timeout=30)
    assert code == 0, log_path.read_text()


def banner_exports(banner: str) -> str:
    """The ``export`` lines of the banner (with their continuation lines), as a user pastes them."""
    pasted: list[str] = []
    continuing = False
    for line in banner.splitlines():
        if line.startswith("  export ") or continuing:
            pasted.append(line.strip())
            continuing = line.endswith("\\")
    assert pasted, banner
    return "\n".join(pasted)


def run_bash(script: str, env: dict[str, str], *, cwd: Path, timeout_s: float = 60) -> dict[str, str]:
    """Run ``script`` in bash (stopping at the first failing command); return the environment it leaves."""
    state = cwd / ".readme-env"
    result = subprocess.run(
        ["bash", "-c", f'set -euo pipefail\n{script}\nenv -0 > "$README_ENV_STATE"'],
        cwd=cwd,
        env={**env, "README_ENV_STATE": str(state)},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert result.returncode == 0, f"{script}\n--- exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    variables = dict(item.split("=", 1) for item in state.read_text().split("\0") if "=" in item)
    variables.pop("README_ENV_STATE", None)
    variables.pop("_", None)
    return variables


def backgrounded(script: str, folder: Path) -> str:
    """The lines of BACKGROUND commands start in the background: output, pid and exit status in files."""
    lines = []
    for line in script.splitlines():
        command = line.split("#", 1)[0].strip()
        if command in BACKGROUND:
            name = command.split("=")[-1].replace(" ", "-") if "=" in command else command.replace(" ", "-")
            log, pid, status = (f'"{folder}/{name}.{suffix}"' for suffix in ("log", "pid", "status"))
            line = f"({command} >{log} 2>&1 & echo $! >{pid}; wait $!; echo $? >{status}) >/dev/null 2>&1 &"
        lines.append(line)
    return "\n".join(lines)


def queue_counts(env: dict[str, str], name: str) -> int:
    sqs = boto3.client(
        "sqs",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name=env["AWS_DEFAULT_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )
    url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    names: Any = [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed",
    ]
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
    return sum(int(attributes[name]) for name in names)


def log_events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def test_scripts_dev_runs_the_command_this_test_runs() -> None:
    assert (ROOT / "scripts" / "dev").read_text().splitlines()[-1] == 'exec "$ROOT/.venv/bin/sqs-worker" dev "$@"'


def test_every_block_is_known() -> None:
    """Each fenced block is run below (bash, python; toml: a file), validated (json), or listed in NOT_RUN with
    its reason."""
    known = {"bash", "python", "json", "toml"}
    unknown = [f"README.md:{b.line} ```{b.language}" for b in readme_blocks() if b.language not in known]
    assert not unknown, f"blocks of a language this test cannot run: {unknown}"
    listed = {b.first_line for b in readme_blocks()}
    assert not set(NOT_RUN) - listed, f"NOT_RUN lists blocks the README no longer has: {set(NOT_RUN) - listed}"


def test_json_blocks_are_valid_envelopes() -> None:
    blocks = [b for b in readme_blocks() if b.language == "json"]
    assert blocks
    for block in blocks:
        parse_envelope(block.text)


def test_readme_examples_run_as_written(dev_server: dict[str, str], tmp_path: Path) -> None:
    folder = tmp_path / "project"  # the user's project: nothing of this checkout in it, no PYTHONPATH
    folder.mkdir()
    env = dev_server
    readme = README.read_text()
    ran: list[str] = []
    try:
        for block in readme_blocks():
            if block.language == "json" or block.first_line in NOT_RUN:
                continue
            where = f"README.md:{block.line}"
            file_name = re.fullmatch(r"# ([\w/]+\.(?:py|toml))", block.first_line)
            if block.language in ("python", "toml") and file_name:
                path = folder / file_name.group(1)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(block.text)
            elif block.language == "python":
                env = run_bash(f"python - <<'README_PYTHON'\n{block.text}README_PYTHON", env, cwd=folder)
            else:
                env = run_bash(backgrounded(block.text, folder), env, cwd=folder)
            ran.append(where)
        tests = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "tests/test_jobs.py"],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert tests.returncode == 0, tests.stdout + tests.stderr
        assert "warning" not in (tests.stdout + tests.stderr).lower(), tests.stdout  # pytest-asyncio's, say
        for command in INLINE_COMMANDS.findall(readme):
            env = run_bash(command, env, cwd=folder)
            ran.append(command)
        assert len(ran) >= 4, ran
        run_log = folder / "sqs-worker-run.log"
        expected = 3  # the boto3 example, the typed `.enqueue` and the inline `sqs-worker enqueue`
        try:
            wait_until(
                lambda: sum(e.get("event") == "succeeded" for e in log_events(run_log)) >= expected,
                30,
                "the README's worker to run the README's jobs",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- sqs-worker run:\n{run_log.read_text()}") from None
        succeeded = [e for e in log_events(run_log) if e.get("event") == "succeeded"]
        assert [e["job_type"] for e in succeeded] == ["send_email"] * expected
        wait_until(lambda: queue_counts(env, env["WORKER_QUEUE"]) == 0, 10, "the queue to be empty")
        assert queue_counts(env, env["WORKER_QUEUE"] + "-dlq") == 0
        dashboard_log = folder / "sqs-worker-dashboard---port-8282.log"
        wait_until(lambda: "http://127.0.0.1:8282/" in dashboard_log.read_text(), 30, "the README's dashboard")
        with urllib.request.urlopen("http://127.0.0.1:8282/", timeout=10) as page:
            assert "Overview" in page.read().decode()
    finally:
        for pid in sorted(folder.glob("*.pid")):
            stop_background(folder, pid.stem)


def stop_background(folder: Path, name: str) -> None:
    """SIGTERM a BACKGROUND command: it must exit 0 (a clean shutdown) within 30 s."""
    os.kill(int((folder / f"{name}.pid").read_text()), signal.SIGTERM)
    status = folder / f"{name}.status"
    wait_until(lambda: status.is_file() and status.read_text().strip() != "", 30, f"{name} to exit")
    assert status.read_text().strip() == "0", (folder / f"{name}.log").read_text()
