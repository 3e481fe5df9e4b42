"""Producers on the Cloud Tasks backend refuse and schedule as the SQS producer does: ``run_at`` becomes the
task's ``schedule_time`` (at most 30 days ahead, not with ``delay_s``), and text that is not valid Unicode is the
same one-line ConfigError (CLI exit 2), nothing sent."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from tests.support.cloudtasks import LOCATION, PROJECT, SECRET, Emulator
from worker.backends.cloudtasks.producer import MAX_DELAY_S, job_task
from worker.backends.cloudtasks.settings import CloudTasksSettings
from worker.commands.__main__ import main
from worker.errors import ConfigError
from worker.producer import Job

NOT_UNICODE = r"job 'echo': the payload holds a string that is not valid Unicode .*; nothing sent"


def settings() -> CloudTasksSettings:
    return CloudTasksSettings(project="p", location="l", url="https://w.example/tasks", shared_secret="s" * 16)


def test_run_at_is_the_schedule_time_within_30_days() -> None:
    when = datetime.now(UTC) + timedelta(hours=1)
    _, task = job_task(settings(), "jobs", Job("echo", run_at=when.astimezone(timezone(timedelta(hours=2)))))
    assert task["schedule_time"].ToDatetime(tzinfo=UTC) == when
    _, past = job_task(settings(), "jobs", Job("echo", run_at=datetime.now(UTC) - timedelta(hours=1)))
    assert "schedule_time" not in past  # due at once
    too_far = datetime.now(UTC) + timedelta(seconds=MAX_DELAY_S + 60)
    with pytest.raises(ConfigError, match="30 days"):
        job_task(settings(), "jobs", Job("echo", run_at=too_far))
    with pytest.raises(ConfigError, match="not both"):
        job_task(settings(), "jobs", Job("echo", delay_s=5, run_at=when))
    with pytest.raises(ConfigError, match="timezone"):
        job_task(settings(), "jobs", Job("echo", run_at=datetime(2030, 1, 1)))
    with pytest.raises(ConfigError, match="has no UTC time"):
        job_task(settings(), "jobs", Job("echo", run_at=datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1)))))


@pytest.mark.parametrize("payload", [{"s": "\ud800"}, {"\udfff": 1}, {"deep": [{"s": "a\udc80b"}]}])
def test_a_lone_surrogate_is_the_sqs_producers_config_error(payload: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=NOT_UNICODE):
        job_task(settings(), "jobs", Job("echo", payload))


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    monkeypatch.chdir(tmp_path)
    for name in [name for name in os.environ if name.startswith("WORKER_")]:
        monkeypatch.delenv(name)
    for name, value in {
        "WORKER_BACKEND": "cloudtasks",
        "WORKER_QUEUE": f"projects/{PROJECT}/locations/{LOCATION}/queues/jobs",
        "WORKER_CLOUDTASKS_URL": "http://127.0.0.1:9/tasks",
        "WORKER_CLOUDTASKS_SHARED_SECRET": SECRET,
        "WORKER_CLOUDTASKS_EMULATOR_HOST": "127.0.0.1:9",  # nothing listens: every refusal comes before a call
    }.items():
        monkeypatch.setenv(name, value)
    return monkeypatch


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_cli_refuses_as_under_sqs(cli_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["enqueue", "echo", "--payload", '{"s": "\\ud800"}']) == 2
    assert "not valid Unicode" in one_line_error(capsys)
    assert main(["enqueue", "echo", "--delay-s", str(MAX_DELAY_S + 1)]) == 2
    assert "30 days" in one_line_error(capsys)
    far = (datetime.now(UTC) + timedelta(days=31)).isoformat()
    assert main(["enqueue", "echo", "--run-at", far]) == 2
    assert "30 days" in one_line_error(capsys)
    soon = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    assert main(["enqueue", "echo", "--run-at", soon, "--delay-s", "5"]) == 2
    assert "not both" in one_line_error(capsys)


def test_cli_run_at_reaches_the_task(
    cli_env: pytest.MonkeyPatch, tasks_emulator: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    queue = tasks_emulator.new_queue()
    tasks_emulator.pause(queue)
    cli_env.setenv("WORKER_QUEUE", f"projects/{PROJECT}/locations/{LOCATION}/queues/{queue}")
    cli_env.setenv("WORKER_CLOUDTASKS_EMULATOR_HOST", tasks_emulator.host)
    when = (datetime.now(UTC) + timedelta(days=2)).replace(microsecond=0)
    assert main(["enqueue", "echo", "--run-at", when.isoformat().replace("+00:00", "Z")]) == 0
    [task] = tasks_emulator.tasks(queue)
    assert task.schedule_time.timestamp() == when.timestamp()


@pytest.mark.parametrize(
    ("command", "says"),
    [
        (["enqueue"], ["SQS: up to a year", "Cloud Tasks: up to 30 days", "refused on Cloud Tasks"]),
        (["dlq"], ["WORKER_CLOUDTASKS_DEAD_LETTER_TABLE", "--rate and --no-move-task do not apply"]),
        (["dlq", "redrive"], ["SQS: at most N messages per second", "on SQS: the receive/send/delete path only"]),
        (["dlq", "requeue"], ["X-Worker-Requeue-Reason", "Cloud Tasks: task names"]),
    ],
)
def test_help_says_what_holds_on_each_backend(
    command: list[str], says: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for words in says:
        assert words in text
