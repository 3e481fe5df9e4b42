"""Settings are read only through the settings classes: what comes from where (environment, ``.env``), and no
module of the package reads or writes ``os.environ`` itself (``sqs-worker dev`` included)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from worker.commands.__main__ import judged_settings
from worker.dev.server import DEV_QUEUE, DevSettings, exports
from worker.errors import ConfigError
from worker.settings import (
    PROCESS_INDEX_ENV,
    AwsConnection,
    aws_region,
    load_settings,
    read_dotenv,
    unknown_variables,
    variable_names,
    variable_warnings,
)

PACKAGE = Path(__file__).resolve().parents[1] / "worker"


def environment_uses(path: Path) -> list[str]:
    """``os.environ``, ``os.getenv``, ``os.putenv``, ``os.unsetenv`` and ``from os import environ`` in a module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in {"environ", "getenv", "putenv", "unsetenv", "environb"}:
            found.append(f"{path.name}:{node.lineno} .{node.attr}")
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [f"{path.name}:{node.lineno} from os import {a.name}" for a in node.names if "env" in a.name]
    return found


def test_no_module_but_settings_touches_the_process_environment() -> None:
    modules = [path for path in PACKAGE.rglob("*.py") if path.name != "settings.py"]
    assert len(modules) > 20
    assert [use for path in modules for use in environment_uses(path)] == []


def test_the_region_comes_from_aws_region_then_aws_default_region(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-2")
    assert aws_region() == "eu-west-1"
    monkeypatch.setenv("AWS_REGION", "")
    assert aws_region() == "us-east-2"
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    with pytest.raises(ConfigError, match="no AWS region"):
        aws_region()


def test_dotenv_holds_worker_variables_not_aws_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As the README states: .env is read for WORKER_*; the AWS variables only from the process environment, as
    botocore reads them (so the worker and botocore never disagree), and an AWS line in .env is reported."""
    (tmp_path / ".env").write_text("WORKER_QUEUE=from-dotenv\nAWS_REGION=eu-north-1\nAWS_ENDPOINT_URL=http://x:1\n")
    monkeypatch.chdir(tmp_path)
    for name in ("WORKER_QUEUE", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    assert load_settings().queue == "from-dotenv"
    assert capsys.readouterr().err == (
        "sqs-worker: warning: .env sets AWS_ENDPOINT_URL, AWS_REGION, not read from there: AWS variables come from "
        "the process environment only (as botocore reads them); export them: set -a; . ./.env; set +a\n"
    )
    with pytest.raises(ConfigError, match="no AWS region"):
        aws_region()
    monkeypatch.setenv("AWS_REGION", "eu-north-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://x:1")
    assert load_settings().aws() == AwsConnection(region="eu-north-1")
    assert capsys.readouterr().err == ""  # exported with the same values: nothing left unread
    monkeypatch.setenv("AWS_REGION", "eu-west-1")  # exported, but not what .env says: the export wins, said once
    assert load_settings().aws() == AwsConnection(region="eu-west-1")
    assert capsys.readouterr().err == (
        "sqs-worker: warning: .env sets AWS_REGION to another value than the environment's, which is the one "
        "used: AWS variables come from the process environment only (as botocore reads them)\n"
    )


def test_dev_defaults_give_way_to_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("WORKER_QUEUE", "WORKER_IDEMPOTENCY_TABLE", "WORKER_SCHEDULES_FILE", "WORKER_POLL_WAIT_S"):
        monkeypatch.delenv(name, raising=False)
    settings = load_settings(DevSettings)
    assert (settings.queue, settings.log_format, settings.metrics, settings.poll_wait_s) == (
        DEV_QUEUE,
        "text",
        "off",
        5,
    )
    assert settings.schedules_file is None  # no schedules.example.yaml in this folder
    (tmp_path / "schedules.example.yaml").write_text("schedules: []\n")
    monkeypatch.setenv("WORKER_QUEUE", "mine")
    monkeypatch.setenv("WORKER_POLL_WAIT_S", "21")
    with pytest.raises(ConfigError, match="WORKER_POLL_WAIT_S"):  # the dev defaults keep the settings' bounds
        load_settings(DevSettings)
    monkeypatch.setenv("WORKER_POLL_WAIT_S", "1")
    settings = load_settings(DevSettings)
    assert (settings.queue, settings.poll_wait_s) == ("mine", 1)
    assert settings.schedules_file == str(tmp_path / "schedules.example.yaml")


def test_dev_passes_its_endpoint_explicitly_and_prints_every_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    (tmp_path / "schedules.example.yaml").write_text("schedules: []\n")
    connection = AwsConnection("ap-south-1", "http://127.0.0.1:4599", "dev", "dev")
    settings = load_settings(DevSettings).with_aws(connection)
    assert settings.aws().client_kwargs() == {
        "region_name": "ap-south-1",
        "endpoint_url": "http://127.0.0.1:4599",
        "aws_access_key_id": "dev",
        "aws_secret_access_key": "dev",
    }
    assert exports(settings) == {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:4599",
        "AWS_REGION": "ap-south-1",
        "AWS_DEFAULT_REGION": "ap-south-1",
        "AWS_ACCESS_KEY_ID": "dev",
        "AWS_SECRET_ACCESS_KEY": "dev",
        "WORKER_QUEUE": DEV_QUEUE,
        "WORKER_IDEMPOTENCY_TABLE": "sqs-worker-dev-idempotency",
        "WORKER_SCHEDULES_FILE": str(tmp_path / "schedules.example.yaml"),
    }


def test_unknown_worker_variables_are_named_with_the_setting_they_misspell() -> None:
    known = ["WORKER_CONCURRENCY", "WORKER_DASHBOARD_TOKEN", "WORKER_QUEUE", "WORKER_VISIBILITY_TIMEOUT_S"]
    names = ["WORKER_QUEUE", "WORKER_CONCURENCY", "WORKER_VISIBILTY_TIMEOUT_S", "WORKER_ID", "HOME"]
    names += ["WORKER_DASHBOARD_TOKEN", "WORKER_DASHBOARD_TOKN"]  # a judged family
    names += ["WORKER_WEBHOOK_SECRET", "WORKER_EMAIL_HOSTT"]  # the recipes' families are not judged
    assert unknown_variables(names, known) == [
        "WORKER_CONCURENCY (did you mean WORKER_CONCURRENCY?)",
        "WORKER_DASHBOARD_TOKN (did you mean WORKER_DASHBOARD_TOKEN?)",
        "WORKER_ID",
        "WORKER_VISIBILTY_TIMEOUT_S (did you mean WORKER_VISIBILITY_TIMEOUT_S?)",
    ]


def test_the_dashboard_and_cloud_tasks_variables_are_known_by_their_own_settings() -> None:
    known = [name for cls in judged_settings() for name in variable_names(cls)]
    assert {"WORKER_QUEUE", "WORKER_DASHBOARD_TOKEN", "WORKER_DASHBOARD_TRUST_ALB_OIDC"} <= set(known)
    assert {"WORKER_CLOUDTASKS_URL", "WORKER_CLOUDTASKS_SHARED_SECRET", "WORKER_CLOUDTASKS_PROJECT"} <= set(known)


def test_the_command_line_warns_once_about_misspelt_variables_and_unparsed_dotenv_lines(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("WORKER_QUEUE=jobs\nthis is not a dotenv line\nWORKER_POLLWAIT_S=3\n")
    env = {**os.environ, "WORKER_CONCURENCY": "5", "WORKER_DASHBOARD_TOKN": "s3cret", "AWS_REGION": "eu-west-1"}
    env.pop(PROCESS_INDEX_ENV, None)
    run = subprocess.run(
        [sys.executable, "-m", "worker.commands", "schema"], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr.splitlines() == [
        "sqs-worker: warning: .env line(s) 2 do not parse (KEY=value): skipped",
        "sqs-worker: warning: not a setting, ignored: WORKER_CONCURENCY (did you mean WORKER_CONCURRENCY?), "
        "WORKER_DASHBOARD_TOKN (did you mean WORKER_DASHBOARD_TOKEN?), "
        "WORKER_POLLWAIT_S (did you mean WORKER_POLL_WAIT_S?)",
    ]
    child = subprocess.run(  # a process the supervisor started: the supervisor warned already
        [sys.executable, "-m", "worker.commands", "schema"],
        env={**env, PROCESS_INDEX_ENV: "1"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert (child.returncode, child.stderr) == (0, "")


def test_a_quote_left_open_names_every_line_it_swallows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """python-dotenv reads an open quote on to the next quote: the lines between are lost, and named."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(PROCESS_INDEX_ENV, raising=False)
    (tmp_path / ".env").write_text('WORKER_CONCURRENCY=3\nWORKER_QUEUE="jobs\nWORKER_WAIT=5\nWORKER_X="y"\nbad\n')
    dotenv = read_dotenv(tmp_path / ".env")
    assert dotenv.values == {"WORKER_CONCURRENCY": "3", "bad": None}
    assert dotenv.unparsed_lines == ((2, 4),)
    assert variable_warnings()[0] == ".env line(s) 2-4 do not parse (KEY=value; is a quote left open?): skipped"


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("variable", ["WORKER_SHUTDOWN_GRACE_S", "WORKER_START_TIMEOUT_S", "WORKER_HEALTH_MAX_AGE_S"])
def test_a_time_setting_is_a_finite_number(variable: str, value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER_QUEUE", "jobs")
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=f"^invalid settings: {variable}: Input should be a finite number"):
        load_settings()


def test_a_bad_option_is_one_line(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "worker.commands", "enqueue", "x", "--delay-s", "1.5"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2
    assert run.stderr == (
        "sqs-worker enqueue: error: argument --delay-s: invalid int value: '1.5' (see sqs-worker enqueue --help)\n"
    )


@pytest.mark.parametrize("namespace", ["", "   ", "AWS/Lambda", "a|b", "x" * 256, ":abc", "Ünïcode"])
def test_a_namespace_cloudwatch_would_refuse_stops_the_start(namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER_QUEUE", "jobs")
    monkeypatch.setenv("WORKER_METRICS_NAMESPACE", namespace)
    with pytest.raises(ConfigError, match=r"^invalid settings: WORKER_METRICS_NAMESPACE: a CloudWatch namespace is"):
        load_settings()
    monkeypatch.setenv("WORKER_METRICS_NAMESPACE", "My App/jobs #1: worker-a_b.c")
    assert load_settings().metrics_namespace == "My App/jobs #1: worker-a_b.c"


@pytest.mark.parametrize(
    ("argv", "command"),
    [(["run", "--bogus"], "run"), (["dlq", "list", "--bogus"], "dlq list"), (["stats", "--json", "-x"], "stats")],
)
def test_an_unknown_option_names_the_help_of_its_command(argv: list[str], command: str, tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "worker.commands", *argv], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert run.returncode == 2
    assert run.stderr.endswith(f"(see sqs-worker {command} --help)\n")
    assert run.stderr.startswith(f"sqs-worker {command}: error: unrecognized arguments: ")
    assert len(run.stderr.splitlines()) == 1
