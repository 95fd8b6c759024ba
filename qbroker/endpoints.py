"""RPC endpoints: one handler per name, or TopOSM-style command endpoints dispatching on ``command``."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, TypedDict, TypeVar

from pydantic import BaseModel

from qbroker.context import RequestContext
from qbroker.errors import InvalidParams, UnknownCommand
from qbroker.handlers import Extra, Handler
from qbroker.middleware import ChainCache

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class EndpointOptions:
    """How an endpoint is served: the options ``Unit.rpc``, ``Unit.commands`` and ``Unit.add_rpc`` take (as
    ``EndpointSettings`` keywords), with their defaults and checks written here once."""

    prefetch: int = 64  # requests in hand at once (the queue's unacked limit for this consumer)
    exclusive: bool = False  # only this connection consumes the queue; it goes with the connection
    single_active: bool = False  # one active consumer among the servers, the others standing by
    max_priority: int | None = None  # the queue's message priorities (x-max-priority)
    timeout: float | None = None  # a request still running after this many seconds is answered `timeout`
    retries: int = 0  # a failed request is tried again this many times (parked on the broker in between)
    # RabbitMQ consumer priority (x-priority): a higher one gets work first, a lower one only when
    # every higher consumer is at its prefetch limit (EventMQ worker weights, RQ consume PRIORITY).
    priority: int | None = None
    retry_delay: float = 0.1  # seconds before the first retry; doubled for each further one
    # This endpoint's own body limit (below the unit's max_body_bytes): a bigger request is answered
    # `too_large` before it is decoded. RabbitMQ has no per-queue message size limit to do it earlier.
    max_body_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.prefetch < 1:
            raise ValueError("prefetch must be at least 1")
        if self.retry_delay <= 0:
            raise ValueError("retry_delay must be positive")
        if self.max_body_bytes is not None and self.max_body_bytes < 1:
            raise ValueError("max_body_bytes must be positive")


class EndpointSettings(TypedDict, total=False):
    """``EndpointOptions`` as keyword arguments (``**options: Unpack[EndpointSettings]``), so a type checker
    checks every option a caller passes. Its keys are EndpointOptions' fields (tests/qbroker/core checks they agree)."""

    prefetch: int
    exclusive: bool
    single_active: bool
    max_priority: int | None
    timeout: float | None
    retries: int
    priority: int | None
    retry_delay: float
    max_body_bytes: int | None


@dataclass
class Endpoint:
    """A plain RPC endpoint: the whole body goes to one handler."""

    name: str
    options: EndpointOptions
    handler: Handler | None = None
    executor: Executor | None = field(default=None, repr=False)  # the unit's pool for sync handlers
    chain: ChainCache = field(default_factory=ChainCache, repr=False, compare=False)  # its middleware chain

    async def dispatch(self, body: Any, ctx: RequestContext) -> Any:
        assert self.handler is not None
        return await self.handler.call(body, ctx)

    def serves(self, name: str | None) -> bool:
        """Whether a request whose header names ``name`` is this endpoint's (the protocol: the name matches the
        routing key; docs/wire-format.md, "Header"). A retry or a re-published copy keeps its name; an endpoint
        bound with a wildcard takes whatever its binding delivers."""
        return name == self.name or "*" in self.name or "#" in self.name

    def describe(self) -> dict[str, Any]:
        return {"schema": self.handler.json_schema() if self.handler else {}}


@dataclass
class CommandEndpoint(Endpoint):
    """``{"command": "stats", ...}``: each command has its own handler and parameter model."""

    commands: dict[str, Handler] = field(default_factory=dict)

    def command(
        self, command: str, *, extra: Extra = "forbid", request: type[BaseModel] | None = None
    ) -> Callable[[F], F]:
        """Register ``fn`` for ``command``; ``request``: the pydantic model the whole body (less ``command``)
        is validated against, given to the handler's one parameter whatever its annotation says."""

        def register(fn: F) -> F:
            if command in self.commands:
                raise ValueError(f"command {command!r} is already registered on {self.name}")
            self.commands[command] = Handler(
                fn, f"{self.name}:{command}", extra=extra, executor=self.executor, request=request
            )
            return fn

        return register

    async def dispatch(self, body: Any, ctx: RequestContext) -> Any:
        if not isinstance(body, dict) or "command" not in body:
            raise InvalidParams(f"invalid parameters for {self.name}: expected a JSON object with a 'command' field")
        command = body["command"]
        handler = self.commands.get(command) if isinstance(command, str) else None
        if handler is None:
            known = ", ".join(sorted(self.commands))
            raise UnknownCommand(f"unknown command {command!r} for {self.name} (known: {known})")
        params = {k: v for k, v in body.items() if k != "command"}
        return await handler.call(params, ctx)

    def describe(self) -> dict[str, Any]:
        return {
            "schema": {
                "type": "object",
                "required": ["command"],
                "properties": {"command": {"enum": sorted(self.commands)}},
            },
            "commands": {name: h.json_schema() for name, h in sorted(self.commands.items())},
        }
