"""The ``sqs-worker`` command line. Each command lives in a module of ``worker.commands`` that adds its
own sub-parser; this module wires them together and turns errors into one clear line.

Exit codes: 0 done; 1 the operation failed in part (e.g. dead letters left behind); 2 a wrong setting or an AWS
endpoint that cannot serve the command (unreachable, refused credentials, access denied, no such queue or
table), said in one line; 130 interrupted; 141 the reader of stdout went away
(``| head``), quietly. Commands may add their own (``status``: 3, no record)."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from botocore.exceptions import BotoCoreError, ClientError

from worker.errors import ConfigError, LedgerUnavailable, QueueUnavailable, WorkerError
from worker.settings import variable_warnings

if TYPE_CHECKING:
    from pydantic_settings import BaseSettings

#: Modules that each define ``add_parser(subparsers)``; their parsers set ``func(args) -> int``.
COMMAND_MODULES = (
    "worker.commands.core",
    "worker.commands.health",
    "worker.commands.dlq",
    "worker.commands.stats",
    "worker.commands.status",
    "worker.commands.schedules",
    "worker.commands.tasks",
    "worker.commands.dashboard",
    "worker.commands.breakers",
)


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, as every other error of the command line (exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="sqs-worker",
        description="Background jobs on AWS SQS: run the worker, enqueue jobs, bootstrap queues.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(subparsers)
    return parser


def chosen(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the command ``args`` were parsed for: ``dlq list`` for ``sqs-worker dlq list ...``."""
    current = parser
    while True:
        commands = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, commands[0].dest, None) if commands else None
        if not commands or name not in commands[0].choices:
            return current
        current = commands[0].choices[name]


#: 128 + SIGPIPE: what a shell reports for ``cat big | head`` under ``set -o pipefail``.
EXIT_BROKEN_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; a closed stdout (``sqs-worker dlq show ID | head -c 100``) ends it quietly."""
    try:
        try:
            return _main(argv)
        finally:  # what is still buffered meets the closed pipe here, not at exit
            sys.stdout.flush()
    except BrokenPipeError:
        # Point stdout at /dev/null so the interpreter's last flush at exit finds nowhere to fail.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE


def judged_settings() -> tuple[type[BaseSettings], ...]:
    """The settings classes whose ``WORKER_*`` families are judged beside the worker's: the dashboard's and
    Cloud Tasks' (both plain pydantic-settings classes, whatever extras are installed)."""
    from worker.backends.cloudtasks.settings import CloudTasksSettings
    from worker.dashboard.config import DashboardSettings

    return DashboardSettings, CloudTasksSettings


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:  # said by the command they were given to, which names its own --help
        chosen(parser, args).error(f"unrecognized arguments: {' '.join(extras)}")
    logging.getLogger("dotenv.main").disabled = True  # its warnings name no file; variable_warnings' do
    for warning in variable_warnings(*judged_settings()):
        print(f"sqs-worker: warning: {warning}", file=sys.stderr)
    try:
        code: int = args.func(args)
    except (ConfigError, QueueUnavailable, LedgerUnavailable) as exc:
        print(f"sqs-worker: error: {exc}", file=sys.stderr)
        return 2
    except (BotoCoreError, ClientError) as exc:  # a call no command translated: still one line
        from worker.backends.aws import translate

        print(f"sqs-worker: error: {translate(exc, 'AWS call')}", file=sys.stderr)
        return 2
    except WorkerError as exc:
        print(f"sqs-worker: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
