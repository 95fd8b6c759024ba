"""Middleware: one ordered chain around every request and alert a unit handles, and a hook around every
message it sends. The built-in behaviours (poison counting, deadlines, delivered notices, retries, handler
observers) are links of the same chain, so tracing, auth, metrics or rate limits are added the same way,
without forking (the onion of FastStream's middlewares, with Dramatiq's fixed order of built-ins).

Order for a request from ``rpc_<name>``, outermost first (a link sees the outcome of everything inside it):

    1. ``Unit.use(mw)`` middlewares, in the order added        tracing, auth, rate limits
    2. PoisonCount      a redelivered request: re-queue it with its count, or answer ``poison_request``
    3. Deadline         the caller gave up: answer ``deadline_passed``, do not run it
    4. DeliveredNotice  the caller asked to know when a server picked its request up
    5. Retries          status ``error``: park a copy for a later try (endpoints with ``retries``)
    6. ``Unit.use(mw, inner=True)`` middlewares               around the handler alone
    7. HandlerObservers ``unit.handler_observers`` (callbacks of one's own), when there are any
    8. the handler: ``run_handler`` (validation, timeout, exception -> error element)

An alert (and a broadcast) runs 1, 6, 7, 8 per matching listener. The header and body are read before
the chain (a message that cannot be read never reaches it: it is answered ``fail`` and each middleware's
``refused`` is told, so metrics and audit logs see it too). ``call_next`` returns ``(result, error)``
and does not raise; a middleware refuses a request by returning ``refuse(exc)`` (or raising a
``QBrokerError``, which the links outside it then see as an exception). A link that answers in the
request's place (a re-published copy will be answered) sets ``ctx.handed_on``: no reply is sent then.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, SupportsIndex

from qbroker.context import RequestContext
from qbroker.errors import ErrorInfo, QBrokerError

Outcome = tuple[Any, ErrorInfo | None]
Next = Callable[[RequestContext, Any], Awaitable[Outcome]]
SendKind = Literal["call", "cast", "alert", "gather"]
HandlerObserver = Callable[[str, str, str, float], None]
"""Called after each handler with (part, kind, status, seconds); e.g. ``UnitMetrics.observe``."""


def refuse(exc: QBrokerError, part: str) -> Outcome:
    """The outcome that answers a request (of endpoint ``part``) with ``exc`` instead of running it."""
    return None, exc.to_info(part=part)


@dataclass
class Sending:
    """One message this unit sends (a call, cast, alert or gather), as the ``send`` hooks see it.

    ``headers`` are added to the message's AMQP headers (e.g. a W3C ``traceparent``); ``reply`` is set
    when a call is answered."""

    kind: SendKind
    name: str
    headers: dict[str, Any] = field(default_factory=dict)
    reply: Any = None


class Middleware:
    """Override ``handle`` (around handled requests and alerts), ``send`` (around sent messages) and/or
    ``refused`` (told of messages refused before any chain)."""

    async def handle(self, call_next: Next, ctx: RequestContext, body: Any) -> Outcome:
        return await call_next(ctx, body)

    def refused(self, name: str, kind: str, error: ErrorInfo) -> None:
        """A request (``kind`` "rpc", ``name`` its endpoint) or alert ("alert", its name as sent) was refused
        before any chain ran: its header or body unreadable, too large, or in a codec not accepted. It is
        answered (or dropped, if nobody asked) with ``error``, status ``fail``."""

    def send(self, sending: Sending) -> contextlib.AbstractContextManager[None] | None:
        """A context entered before the message is built and left when it is done with (a call answered,
        a gather ended): what it raises passes through it. None: nothing to do."""
        return None


def _overrides(middleware: Middleware, name: str) -> bool:
    return getattr(type(middleware), name) is not getattr(Middleware, name)


class HandlerObservers(Middleware):
    """``unit.handler_observers``: callbacks told (part, kind, status, seconds) after each handler."""

    def __init__(self, observers: list[HandlerObserver]) -> None:
        self.observers = observers

    async def handle(self, call_next: Next, ctx: RequestContext, body: Any) -> Outcome:
        started = time.perf_counter()
        result, error = await call_next(ctx, body)
        seconds = time.perf_counter() - started
        status = "ok" if error is None else error.status
        part = ctx.part or ctx.header.name or ""
        for observe in self.observers:
            try:
                observe(part, ctx.kind, status, seconds)
            except Exception:  # an observer's bug must not turn into a lost reply
                ctx.log.exception("handler observer failed", part=part)
        return result, error


class ObserverList(list[HandlerObserver]):
    """A list of observers that rebuilds the chains when it changes (so an empty one costs nothing)."""

    def __init__(self, changed: Callable[[], None]) -> None:
        super().__init__()
        self._changed = changed

    def append(self, observer: HandlerObserver) -> None:
        super().append(observer)
        self._changed()

    def extend(self, observers: Iterable[HandlerObserver]) -> None:
        super().extend(observers)
        self._changed()

    def insert(self, index: SupportsIndex, observer: HandlerObserver) -> None:
        super().insert(index, observer)
        self._changed()

    def remove(self, observer: HandlerObserver) -> None:
        super().remove(observer)
        self._changed()

    def clear(self) -> None:
        super().clear()
        self._changed()


class MiddlewareStack:
    """The middlewares of one unit, and the chains built from them (rebuilt when they change)."""

    def __init__(self) -> None:
        self.outer: list[Middleware] = []
        self.inner: list[Middleware] = []
        self.senders: list[Middleware] = []
        self.refusal_hooks: list[Middleware] = []
        self.version = 0
        self.observers = ObserverList(self._changed)

    def _changed(self) -> None:
        self.version += 1

    def use(self, middleware: Middleware, *, inner: bool = False) -> None:
        (self.inner if inner else self.outer).append(middleware)
        if _overrides(middleware, "send"):
            self.senders.append(middleware)
        if _overrides(middleware, "refused"):
            self.refusal_hooks.append(middleware)
        self._changed()

    def tell_refused(self, name: str, kind: str, error: ErrorInfo, log: Any) -> None:
        """Tell every middleware's ``refused`` of a message refused before the chain; a hook that fails is
        logged, never lets the message go unanswered."""
        for middleware in self.refusal_hooks:
            try:
                middleware.refused(name, kind, error)
            except Exception:
                log.exception("middleware failed on a refused message", name=name, kind=kind)

    def build(self, builtins: list[Middleware], terminal: Next) -> Next:
        """``terminal`` wrapped in: outer, ``builtins``, inner, observers (see the module's order)."""
        links = [*self.outer, *builtins, *self.inner]
        if self.observers:
            links.append(HandlerObservers(self.observers))
        chain = terminal
        for middleware in reversed(links):
            if _overrides(middleware, "handle"):
                chain = functools.partial(middleware.handle, chain)
        return chain

    def sending(self, kind: SendKind, name: str) -> contextlib.AbstractContextManager[Sending]:
        """The ``send`` hooks of every middleware around one sent message, first added outermost. A cast or
        alert enters this whatever the stack holds: none and one hook go without an ExitStack (a
        generator-based context with an ExitStack costs several microseconds a message)."""
        senders = self.senders
        if not senders:
            return contextlib.nullcontext(Sending(kind, name))
        if len(senders) == 1:
            return _OneHook(senders[0], Sending(kind, name))
        return self._stacked(Sending(kind, name))

    @contextlib.contextmanager
    def _stacked(self, sending: Sending) -> Iterator[Sending]:
        with contextlib.ExitStack() as stack:
            for middleware in self.senders:
                hook = middleware.send(sending)
                if hook is not None:
                    stack.enter_context(hook)
            yield sending


class _OneHook(contextlib.AbstractContextManager[Sending]):
    """The one middleware's ``send`` hook around a sent message (what an ExitStack of one would do)."""

    __slots__ = ("middleware", "sending", "hook")

    def __init__(self, middleware: Middleware, sending: Sending) -> None:
        self.middleware = middleware
        self.sending = sending
        self.hook: contextlib.AbstractContextManager[None] | None = None

    def __enter__(self) -> Sending:
        hook = self.hook = self.middleware.send(self.sending)
        if hook is not None:
            hook.__enter__()
        return self.sending

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        return self.hook.__exit__(exc_type, exc, tb) if self.hook is not None else None


async def _unbuilt(ctx: RequestContext, body: Any) -> Outcome:
    raise AssertionError("a chain used before it was built")  # pragma: no cover - version -1 never matches


class ChainCache:
    """A chain built on first use and again after the stack changed: the user compares ``version`` with
    the stack's (one integer compare per message, inline: this is the hot path) and calls ``set``."""

    __slots__ = ("version", "chain")

    def __init__(self) -> None:
        self.version = -1
        self.chain: Next = _unbuilt

    def set(self, stack: MiddlewareStack, chain: Next) -> Next:
        self.chain, self.version = chain, stack.version
        return chain
