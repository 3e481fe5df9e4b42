"""Job registration: the ``@job`` decorator, each job's options (JobSpec) and the registry that holds them."""

from __future__ import annotations

import asyncio
import functools
import importlib
import importlib.machinery
import inspect
import logging
import math
import sys
import traceback
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Protocol, TypeVar, cast

from pydantic import BaseModel

from worker.context import JobContext
from worker.envelope import MAX_TYPE_LENGTH
from worker.errors import ConfigError
from worker.flow import Breaker, Rate, parse_rate
from worker.lifecycle import Lifespan, add_lifespan
from worker.middleware import Middleware, add_middleware
from worker.policy import describe_error

#: Exceptions that mean a bug in the handler: retrying cannot help, so they are dead-lettered as ``bug``.
DEFAULT_BUG_ERRORS: tuple[type[BaseException], ...] = (
    TypeError,
    AttributeError,
    NameError,
    ImportError,
    SyntaxError,
    NotImplementedError,
    AssertionError,
)

#: maxReceiveCount of a FIFO queue with rate-limited or breaker-guarded jobs (their holds are receives there).
FIFO_FLOW_RECEIVE_COUNT = 100

log = logging.getLogger("worker")

Handler = Callable[..., Any]
KeyFunction = Callable[[Any], str]
LifespanT = TypeVar("LifespanT", bound=Callable[..., Any])
MiddlewareT = TypeVar("MiddlewareT", bound=Callable[..., Any])
P = ParamSpec("P")
R = TypeVar("R", covariant=True)

if TYPE_CHECKING:
    from datetime import datetime

    from worker.producer import BatchResult


class JobFunction(Protocol, Generic[P, R]):
    """What ``@job`` returns: the handler itself (call it directly in a unit test), carrying ``.enqueue`` and its
    twins (``worker.enqueue.JobRef``): the payload is validated against the handler's model before sending."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R: ...

    def enqueue(
        self,
        payload: Any,
        *,
        delay_s: int | None = None,
        idempotency_key: str | None = None,
        group_id: str | None = None,
        run_at: datetime | None = None,
    ) -> str: ...

    async def enqueue_async(
        self,
        payload: Any,
        *,
        delay_s: int | None = None,
        idempotency_key: str | None = None,
        group_id: str | None = None,
        run_at: datetime | None = None,
    ) -> str: ...

    def enqueue_many(
        self,
        payloads: Iterable[Any],
        *,
        delay_s: int | None = None,
        group_id: str | None = None,
        run_at: datetime | None = None,
    ) -> BatchResult: ...

    async def enqueue_many_async(
        self,
        payloads: Iterable[Any],
        *,
        delay_s: int | None = None,
        group_id: str | None = None,
        run_at: datetime | None = None,
    ) -> BatchResult: ...


@dataclass(frozen=True)
class JobSpec:
    """A registered job type and its options."""

    name: str
    handler: Handler
    max_attempts: int = 5
    timeout_s: float = 900.0
    backoff_base_s: float = 2.0
    backoff_max_s: float = 900.0
    permanent: tuple[type[BaseException], ...] = ()
    bugs: tuple[type[BaseException], ...] = DEFAULT_BUG_ERRORS
    idempotent: bool = False
    key: KeyFunction | None = None
    rate: Rate | None = None
    rate_key: KeyFunction | None = None
    breaker: Breaker | None = None
    payload_model: type[BaseModel] | None = field(default=None, compare=False)
    wants_context: bool = field(default=False, compare=False)
    is_async: bool = field(default=True, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ConfigError(f"job type {self.name!r}: must be a str")
        for option in ("timeout_s", "backoff_base_s", "backoff_max_s"):
            value = getattr(self, option)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"job {self.name!r}: {option} must be a number, not {type(value).__name__}")
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise ConfigError(f"job {self.name!r}: max_attempts must be a whole number")
        if not 1 <= len(self.name) <= MAX_TYPE_LENGTH:
            raise ConfigError(f"job type {self.name[:40]!r}: must be 1-{MAX_TYPE_LENGTH} characters, as the envelope's")
        if self.max_attempts < 1:
            raise ConfigError(f"job {self.name!r}: max_attempts must be >= 1")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ConfigError(f"job {self.name!r}: timeout_s must be a finite number > 0")
        if (
            not (math.isfinite(self.backoff_base_s) and math.isfinite(self.backoff_max_s))
            or min(self.backoff_base_s, self.backoff_max_s) < 0
        ):
            raise ConfigError(f"job {self.name!r}: backoff_base_s and backoff_max_s must be finite numbers >= 0")

    @property
    def uses_ledger(self) -> bool:
        """Whether this job is guarded by the idempotency table (idempotent=True or a key function)."""
        return self.idempotent or self.key is not None


def inspect_handler(handler: Handler, *, localns: dict[str, Any] | None = None) -> tuple[type[BaseModel] | None, bool]:
    """The payload model (if the first parameter is annotated with one) and whether it takes a context.

    Annotations are resolved in the handler's module and ``localns`` (the scope the decorator ran in). One
    that cannot be resolved (a misspelt name, a string or ``from __future__ import annotations`` annotation
    naming nothing) is a ConfigError naming the handler and the annotation: the payload would otherwise
    silently arrive as a dict.
    """
    signature = inspect.signature(handler)
    params = [p for p in signature.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not params:
        raise ConfigError(f"handler {handler.__qualname__} must take the payload as its first parameter")
    hints = {param.name: _resolve_annotation(handler, param, localns) for param in params}
    model = hints.get(params[0].name)
    payload_model = model if isinstance(model, type) and issubclass(model, BaseModel) else None
    wants_context = False
    for param in params[1:]:
        hint = hints.get(param.name)
        if param.name in ("ctx", "context") or (isinstance(hint, type) and issubclass(hint, JobContext)):
            wants_context = True
        elif param.default is inspect.Parameter.empty:
            raise ConfigError(
                f"handler {handler.__qualname__}: parameter {param.name!r} is neither the payload nor a context"
            )
    return payload_model, wants_context


def _resolve_annotation(handler: Handler, param: inspect.Parameter, localns: dict[str, Any] | None) -> Any:
    """One parameter's annotation, evaluated when it is a string; a ConfigError when it cannot be."""
    annotation = param.annotation
    if annotation is inspect.Parameter.empty:
        return None
    target = inspect.unwrap(handler.func if isinstance(handler, functools.partial) else handler)
    holder = _Annotated({param.name: annotation}, getattr(target, "__globals__", {}))
    try:
        return typing.get_type_hints(holder, localns=localns).get(param.name)
    except Exception as exc:
        raise ConfigError(
            f"handler {getattr(handler, '__qualname__', handler)!s}: cannot resolve the annotation {annotation!r} "
            f"of parameter {param.name!r} ({type(exc).__name__}: {exc})"
        ) from exc


class _Annotated:
    """Just enough of a function for ``typing.get_type_hints``: its annotations and its module's globals."""

    def __init__(self, annotations: dict[str, Any], globalns: dict[str, Any]) -> None:
        self.__annotations__ = annotations
        self.__globals__ = globalns


class Registry:
    """The job types a worker knows, by name, with the lifespans and middleware its worker runs."""

    def __init__(self) -> None:
        self._jobs: dict[str, JobSpec] = {}
        self.lifespans: list[Lifespan] = []
        self.middlewares: list[Middleware] = []

    def lifespan(self, fn: LifespanT) -> LifespanT:
        """Register a per-process lifespan (see ``worker.lifecycle``)."""
        add_lifespan(self.lifespans, fn)
        return fn

    def middleware(self, fn: MiddlewareT) -> MiddlewareT:
        """Register a middleware around every job (see ``worker.middleware``); the first is the outermost."""
        add_middleware(self.middlewares, fn)
        return fn

    def job(
        self,
        name: str,
        *,
        max_attempts: int = 5,
        timeout_s: float = 900.0,
        backoff_base_s: float = 2.0,
        backoff_max_s: float = 900.0,
        permanent: Iterable[type[BaseException]] = (),
        bugs: Iterable[type[BaseException]] = DEFAULT_BUG_ERRORS,
        idempotent: bool = False,
        key: KeyFunction | None = None,
        rate_limit: str | None = None,
        rate_key: KeyFunction | None = None,
        breaker: Breaker | None = None,
    ) -> Callable[[Callable[P, R]], JobFunction[P, R]]:
        """Register the decorated function (``async def`` or plain ``def``) as the handler of job type ``name``;
        it is returned as it is, with ``.enqueue`` methods added (``worker.enqueue``).

        ``rate_limit`` ("100/m") caps the starts per key (``rate_key(payload)``, default the job type) across the
        fleet; ``breaker`` pauses the jobs of a failing downstream (``worker.flow``).
        """
        try:
            rate = parse_rate(rate_limit) if rate_limit is not None else None
        except ValueError as exc:
            raise ConfigError(f"job {name!r}: {exc}") from None
        if rate_key is not None and rate is None:
            raise ConfigError(f"job {name!r}: rate_key needs a rate_limit")

        def decorate(handler: Callable[P, R]) -> JobFunction[P, R]:
            caller = sys._getframe(1)  # the scope the handler is defined in: its local models resolve there
            try:
                payload_model, wants_context = inspect_handler(handler, localns=dict(caller.f_locals))
            finally:
                del caller
            self.add(
                JobSpec(
                    name=name,
                    handler=handler,
                    max_attempts=max_attempts,
                    timeout_s=timeout_s,
                    backoff_base_s=backoff_base_s,
                    backoff_max_s=backoff_max_s,
                    permanent=tuple(permanent),
                    bugs=tuple(bugs),
                    idempotent=idempotent,
                    key=key,
                    rate=rate,
                    rate_key=rate_key,
                    breaker=breaker,
                    payload_model=payload_model,
                    wants_context=wants_context,
                    is_async=_is_async(handler),
                )
            )
            from worker.enqueue import attach

            attach(handler, name, payload_model)
            return cast(JobFunction[P, R], handler)

        return decorate

    def add(self, spec: JobSpec) -> None:
        existing = self._jobs.get(spec.name)
        if existing is not None and existing.handler is not spec.handler:
            if _same_function(existing.handler, spec.handler):
                # The same module imported twice (as __main__ and by name, or reloaded): keep the newer one.
                self._jobs[spec.name] = spec
                return
            raise ConfigError(f"job type {spec.name!r} is registered twice")
        self._jobs[spec.name] = spec

    def get(self, name: str) -> JobSpec | None:
        return self._jobs.get(name)

    def names(self) -> list[str]:
        return sorted(self._jobs)

    def specs(self) -> list[JobSpec]:
        return [self._jobs[name] for name in self.names()]

    def max_receive_count(self, *, fifo: bool = False) -> int:
        """The redrive policy's maxReceiveCount for a queue of these jobs: a little above the largest
        ``max_attempts`` (5 when none is registered), so the worker dead-letters first, with the reason. On a
        FIFO queue a rate limit's or breaker's holds count receives too (a held message cannot be sent on as a
        copy there): with such jobs, at least FIFO_FLOW_RECEIVE_COUNT."""
        count = max((spec.max_attempts for spec in self._jobs.values()), default=5) + 2
        if fifo and self.flow_controlled():
            return max(count, FIFO_FLOW_RECEIVE_COUNT)
        return count

    def flow_controlled(self) -> list[str]:
        """The job types with a rate limit or a circuit breaker (their starts can be held)."""
        return [spec.name for spec in self._jobs.values() if spec.rate is not None or spec.breaker is not None]

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, name: object) -> bool:
        return name in self._jobs


def _is_async(handler: Handler) -> bool:
    target = handler.func if isinstance(handler, functools.partial) else handler
    return asyncio.iscoroutinefunction(target)


def _same_function(a: Handler, b: Handler) -> bool:
    return getattr(a, "__module__", None) == getattr(b, "__module__", None) and getattr(
        a, "__qualname__", None
    ) == getattr(b, "__qualname__", None)


#: The registry that ``from worker import job`` fills; a worker reads it unless given another.
default_registry = Registry()
job = default_registry.job
lifespan = default_registry.lifespan
middleware = default_registry.middleware


def import_handlers(modules: Iterable[str]) -> None:
    """Import each handler module so its ``@job`` decorators run.

    The current folder is put first on ``sys.path`` (as ``python -m``, uvicorn and celery do), so
    ``WORKER_HANDLERS=app.jobs`` finds ``./app/jobs.py`` without PYTHONPATH, whether the worker was started by its
    console script or with ``python -m``. A ConfigError (one line) names a ``worker`` module there that would shadow
    this package, and a handler module that is missing or raises on import (its traceback is logged at DEBUG).
    """
    names = list(modules)
    if not names:
        return
    folder = Path.cwd()
    if not any(_same_folder(entry, folder) for entry in sys.path):
        sys.path.insert(0, str(folder))
    _refuse_shadowing(folder)
    for module in names:
        try:
            importlib.import_module(module)
        except (Exception, SystemExit) as exc:
            log.debug("importing handler module %r failed", module, exc_info=exc)
            raise ConfigError(describe_import_error(module, exc, folder)) from exc


def _same_folder(entry: str, folder: Path) -> bool:
    try:
        return Path(entry or ".").resolve() == folder.resolve()
    except OSError:
        return False


def _refuse_shadowing(folder: Path) -> None:
    """A ``worker.py`` or ``worker/`` package in ``folder`` would be imported instead of sqs-worker's ``worker``
    (under ``python -m``, and by any code that runs before it): refuse it with one line."""
    spec = importlib.machinery.PathFinder.find_spec("worker", [str(folder)])
    if spec is None or spec.origin is None:  # nothing there, or a folder without __init__.py (never shadows)
        return
    theirs = Path(spec.origin).resolve()
    ours = Path(__file__).resolve().with_name("__init__.py")
    if theirs == ours or (theirs.name == "__init__.py" and theirs.read_bytes() == ours.read_bytes()):
        return  # this package itself, or a copy of its source (a checkout of sqs-worker)
    shown = theirs.parent if theirs.name == "__init__.py" else theirs
    raise ConfigError(
        f"{shown} shadows the sqs-worker package 'worker' (handlers import it: from worker import job): "
        "rename your module"
    )


def describe_import_error(module: str, exc: BaseException, folder: Path) -> str:
    """One line: the module and what went wrong, and where when it raised inside the module."""
    if isinstance(exc, ModuleNotFoundError) and exc.name and (module == exc.name or module.startswith(exc.name + ".")):
        return (
            f"WORKER_HANDLERS: no module {module!r} (looked in {folder} and the installed packages; "
            "run the worker from the folder that holds it, or install it)"
        )
    where = ""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [frame for frame in frames if "importlib" not in frame.filename]
    if own and not isinstance(exc, SyntaxError):
        where = f" ({own[-1].filename}, line {own[-1].lineno})"
    text = " ".join(describe_error(exc).split())  # safe for an exception whose __str__ raises
    return f"WORKER_HANDLERS: importing {module!r} failed: {text}{where}"
