"""Middleware: code around every job, registered with ``@middleware``.

A middleware is an ``async def`` taking the job's context and ``call_next``; it returns the job's result::

    @middleware
    async def timing(ctx: JobContext, call_next: CallNext) -> Any:
        started = time.monotonic()
        try:
            return await call_next()              # the next middleware, at the end the handler
        finally:
            ctx.logger.info("took %.3f s", time.monotonic() - started)

The first registered is the outermost. A middleware sees the outcome (``call_next()`` returns the result or
raises the handler's exception), may change it, and may short-circuit: return a result without calling
``call_next`` (the job succeeds with it) or raise (``PermanentError``, ``RetryableError`` or any exception,
classified exactly like a handler's; a SystemExit or another BaseException too). Middleware runs on the event loop
for ``async def`` and plain ``def`` handlers alike; the job's ``timeout_s`` bounds the handler, not the middleware
around it.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from worker.context import JobContext
from worker.errors import ConfigError, FailsTheJob

#: What a middleware calls to run the rest of the chain (the next middleware, at the end the handler).
CallNext = Callable[[], Awaitable[Any]]
#: ``async def middleware(ctx, call_next) -> result``.
Middleware = Callable[[JobContext, CallNext], Awaitable[Any]]


def middleware_name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"


def check_middleware(fn: Any) -> Middleware:
    """``fn`` if it is an ``async def`` (or an object whose ``__call__`` is one) taking ``(ctx, call_next)``."""
    target = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else getattr(fn, "__call__", None)  # noqa: B004
    if target is None or not inspect.iscoroutinefunction(target):
        raise ConfigError(f"middleware {middleware_name(fn)} must be an `async def` taking (ctx, call_next)")
    try:
        inspect.signature(target).bind(None, None)
    except TypeError:
        raise ConfigError(f"middleware {middleware_name(fn)} must take two arguments: (ctx, call_next)") from None
    checked: Middleware = fn
    return checked


def add_middleware(chain: list[Middleware], fn: Any) -> None:
    """Append ``fn`` (checked); the same function registered again (a module imported twice) replaces itself."""
    checked = check_middleware(fn)
    for index, existing in enumerate(chain):
        if existing is checked or (inspect.isfunction(fn) and middleware_name(existing) == middleware_name(fn)):
            chain[index] = checked
            return
    chain.append(checked)


async def call_through(chain: Sequence[Middleware], ctx: JobContext, handler: CallNext) -> Any:
    """Run ``handler`` inside ``chain`` (the first the outermost); returns what the outermost returns.

    A middleware's BaseException that is no Exception (SystemExit, ...) becomes HandlerExit: the job's failure,
    never the worker's exit (``asyncio.CancelledError`` passes as it is). A result that is an awaitable nobody
    awaited (``return call_next()`` without ``await``: the handler never ran) is a TypeError, the job's bug."""
    with FailsTheJob("middleware"):
        result = await _call_chain(chain, ctx, handler)
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()  # never run: no "was never awaited" warning on top
        raise TypeError(
            "the job's result is an awaitable nobody awaited: a middleware's `return call_next()` needs `await` "
            "(the handler did not run), and a handler must not return one"
        )
    return result


async def _call_chain(chain: Sequence[Middleware], ctx: JobContext, handler: CallNext) -> Any:
    if not chain:
        return await handler()

    def link(index: int) -> CallNext:
        if index == len(chain):
            return handler

        async def call_next() -> Any:
            return await chain[index](ctx, link(index + 1))

        return call_next

    return await link(0)()
