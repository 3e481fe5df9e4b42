"""Per-process resources: lifespans that open them before the first receive and close them after the last job.

A lifespan is a generator function registered with ``@lifespan`` (``async def`` with ``yield``, or a plain
``def`` with ``yield``). The code before its ``yield`` runs once per worker process, before the first receive;
what it yields (a dict of named resources, or nothing) becomes part of ``ctx.resources``; the code after its
``yield`` runs at shutdown, after the running jobs have finished (or were cancelled at the grace period).
Lifespans start in registration order and stop in reverse. One that raises at start stops the worker with one
line (a ConfigError) before anything is received; one that raises at shutdown is logged and the others still run.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from worker.errors import ConfigError
from worker.policy import describe_error

log = logging.getLogger("worker")

T = TypeVar("T")

#: A lifespan: a generator function (async or plain) yielding a dict of resources, or None.
Lifespan = Callable[[], AsyncIterator[Any] | Iterator[Any]]


class Resources(Mapping[str, Any]):
    """What the lifespans yielded, by name: ``ctx.resources["http"]``, or typed: ``ctx.resources.get_as("http",
    httpx.AsyncClient)``. Read-only; the same objects for every job of the process (and every thread)."""

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        self._values = dict(values or {})

    def __getitem__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            known = ", ".join(sorted(self._values)) or "none"
            raise KeyError(f"no resource {name!r} (the lifespans yielded: {known})") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Resources({sorted(self._values)})"

    def get_as(self, name: str, kind: type[T]) -> T:
        """The resource ``name``, checked to be a ``kind`` (typed for mypy); KeyError or TypeError otherwise."""
        value = self[name]
        if not isinstance(value, kind):
            raise TypeError(f"resource {name!r} is a {type(value).__qualname__}, not a {kind.__qualname__}")
        return value


def lifespan_name(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def check_lifespan(fn: Any) -> Lifespan:
    """``fn`` if it is a generator function taking no arguments, else a ConfigError naming it."""
    if not (inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn)):
        raise ConfigError(
            f"lifespan {lifespan_name(fn)} must be a generator function: `async def` (or `def`) with one `yield`"
        )
    required = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if required:
        raise ConfigError(f"lifespan {lifespan_name(fn)} must take no arguments")
    result: Lifespan = fn
    return result


def add_lifespan(lifespans: list[Lifespan], fn: Any) -> None:
    """Append ``fn`` (checked); the same function registered again (a module imported twice) replaces itself."""
    checked = check_lifespan(fn)
    for index, existing in enumerate(lifespans):
        if existing is checked or lifespan_name(existing) == lifespan_name(checked):
            lifespans[index] = checked
            return
    lifespans.append(checked)


@contextlib.asynccontextmanager
async def open_lifespans(lifespans: Sequence[Lifespan]) -> AsyncIterator[Resources]:
    """Start each lifespan in order and yield their merged resources; at exit stop them in reverse order.

    A failure at start stops the ones already started, then raises a ConfigError of one line naming the
    lifespan. A failure at stop is logged (one line, its traceback at DEBUG) and does not stop the others.
    """
    started: list[tuple[Lifespan, contextlib.AbstractAsyncContextManager[Any]]] = []
    merged: dict[str, Any] = {}
    try:
        for fn in lifespans:
            manager = _manager(fn)
            try:
                value = await manager.__aenter__()
            except (KeyboardInterrupt, asyncio.CancelledError):
                raise  # Ctrl-C or a cancellation of the start itself: not the lifespan's failure
            except BaseException as exc:  # a sys.exit() in a lifespan too: one line, exit 2
                log.debug("lifespan %s failed at startup", lifespan_name(fn), exc_info=exc)
                raise ConfigError(f"lifespan {lifespan_name(fn)} failed at startup: {describe_error(exc)}") from exc
            started.append((fn, manager))
            merged.update(_resources_of(fn, value, merged))
    except BaseException:
        await _stop(started)
        raise
    try:
        yield Resources(merged)
    finally:
        await _stop(started)


def _manager(fn: Lifespan) -> contextlib.AbstractAsyncContextManager[Any]:
    if inspect.isasyncgenfunction(fn):
        return contextlib.asynccontextmanager(fn)()
    return _AsyncOfSync(contextlib.contextmanager(fn)())  # type: ignore[arg-type]


class _AsyncOfSync(contextlib.AbstractAsyncContextManager[Any]):
    """A plain ``def`` lifespan, run on the event loop (before the first receive, after the last job)."""

    def __init__(self, manager: contextlib.AbstractContextManager[Any]) -> None:
        self._manager = manager

    async def __aenter__(self) -> Any:
        return self._manager.__enter__()

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        return self._manager.__exit__(*exc_info)


def _resources_of(fn: Lifespan, value: Any, merged: Mapping[str, Any]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(name, str) for name in value):
        raise ConfigError(
            f"lifespan {lifespan_name(fn)} must yield a dict of named resources (or nothing), "
            f"not a {type(value).__qualname__}"
        )
    clash = sorted(set(value) & set(merged))
    if clash:
        raise ConfigError(f"lifespan {lifespan_name(fn)}: resource {clash[0]!r} is yielded by another lifespan too")
    return dict(value)


async def _stop(started: list[tuple[Lifespan, contextlib.AbstractAsyncContextManager[Any]]]) -> None:
    while started:
        fn, manager = started.pop()
        try:
            await manager.__aexit__(None, None, None)
        except (KeyboardInterrupt, asyncio.CancelledError):
            raise
        except BaseException as exc:  # logged; the others still stop
            log.error("lifespan %s failed at shutdown: %s", lifespan_name(fn), describe_error(exc))
            log.debug("lifespan %s failed at shutdown", lifespan_name(fn), exc_info=exc)
