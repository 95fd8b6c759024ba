"""Exchanges of the in-memory broker: direct, fanout and topic routing, and declare equivalence."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from aio_pika.exceptions import ChannelPreconditionFailed

EXCHANGE_TYPES = ("direct", "fanout", "topic")
EXCHANGE_ARGUMENTS = frozenset({"alternate-exchange"})


class UnsupportedFeature(NotImplementedError):
    """The in-memory broker does not implement this part of AMQP; test it against RabbitMQ."""


@lru_cache(maxsize=4096)
def topic_matches(binding_key: str, routing_key: str) -> bool:
    """RabbitMQ topic matching: ``*`` is exactly one word, ``#`` zero or more.

    Deliberately not ``qbroker.alerts.topic_matches``: the broker is the reference qbroker is tested
    against, so it must not share qbroker's implementation (and its bugs).
    """
    pattern = binding_key.split(".")
    words = routing_key.split(".")
    # Dynamic programming over (pattern position, word position): reachable states.
    states = {0}
    for word in words:
        next_states: set[int] = set()
        for p in _close_hashes(states, pattern):
            if p < len(pattern):
                if pattern[p] == "#":
                    next_states.add(p)  # '#' swallows this word and may swallow more
                elif pattern[p] == "*" or pattern[p] == word:
                    next_states.add(p + 1)
        states = next_states
        if not states:
            return False
    return len(pattern) in _close_hashes(states, pattern)


def _close_hashes(states: set[int], pattern: list[str]) -> set[int]:
    """Add the states reached by letting a '#' match zero words."""
    closed = set(states)
    stack = list(states)
    while stack:
        p = stack.pop()
        if p < len(pattern) and pattern[p] == "#" and p + 1 not in closed:
            closed.add(p + 1)
            stack.append(p + 1)
    return closed


def inequivalent(kind: str, name: str, what: str, received: Any, current: Any) -> ChannelPreconditionFailed:
    """RabbitMQ's wording for a re-declare whose settings differ from the existing entity (an argument that
    is None on one side is one that side does not have), which qbroker.topology reads back."""
    if what in ("type", "durable", "auto_delete", "name"):
        difference = f"received {_flag(received)} but current is {_flag(current)}"
    elif received is None or current is None:
        difference = f"received {_typed(received)} but current is {_typed(current)}"
    else:
        difference = f"received {_flag(received)} but current is {_flag(current)}"
    return ChannelPreconditionFailed(
        f"PRECONDITION_FAILED - inequivalent arg '{what}' for {kind} '{name}' in vhost '/': {difference}"
    )


def _flag(value: Any) -> str:
    return f"'{str(value).lower() if isinstance(value, bool) else value}'"


def _typed(value: Any) -> str:
    if value is None:
        return "none"
    kind = "bool" if isinstance(value, bool) else "long" if isinstance(value, int) else "longstr"
    return f"the value {_flag(value)} of type '{kind}'"


@dataclass
class Binding:
    queue: str
    routing_key: str


@dataclass
class ExchangeState:
    name: str
    type: str
    durable: bool
    auto_delete: bool
    arguments: dict[str, Any]
    bindings: list[Binding] = field(default_factory=list)

    @classmethod
    def create(
        cls, name: str, type_: str, *, durable: bool, auto_delete: bool, arguments: dict[str, Any]
    ) -> ExchangeState:
        if type_ not in EXCHANGE_TYPES:
            raise UnsupportedFeature(f"exchange type {type_!r} (the memory broker has {', '.join(EXCHANGE_TYPES)})")
        unknown = set(arguments) - EXCHANGE_ARGUMENTS
        if unknown:
            raise UnsupportedFeature(f"exchange arguments {sorted(unknown)} (supported: {sorted(EXCHANGE_ARGUMENTS)})")
        return cls(name, type_, durable, auto_delete, dict(arguments))

    def check_equivalent(self, type_: str, *, durable: bool, auto_delete: bool, arguments: dict[str, Any]) -> None:
        for what, received, current in (
            ("type", type_, self.type),
            ("durable", durable, self.durable),
            ("auto_delete", auto_delete, self.auto_delete),
        ):
            if received != current:
                raise inequivalent("exchange", self.name, what, received, current)
        for key in sorted(set(arguments) | set(self.arguments)):
            if arguments.get(key) != self.arguments.get(key):
                raise inequivalent("exchange", self.name, key, arguments.get(key), self.arguments.get(key))

    @property
    def alternate_exchange(self) -> str | None:
        value = self.arguments.get("alternate-exchange")
        return str(value) if value is not None else None

    def bind(self, queue: str, routing_key: str) -> None:
        binding = Binding(queue, routing_key)
        if binding not in self.bindings:  # binding twice is a no-op in AMQP
            self.bindings.append(binding)

    def unbind(self, queue: str, routing_key: str) -> None:
        self.bindings = [b for b in self.bindings if b != Binding(queue, routing_key)]

    def forget_queue(self, queue: str) -> None:
        self.bindings = [b for b in self.bindings if b.queue != queue]

    def route(self, routing_key: str) -> list[str]:
        """Names of the queues a message with ``routing_key`` goes to, each once, in binding order."""
        if self.type == "fanout":
            matched = [b.queue for b in self.bindings]
        elif self.type == "direct":
            matched = [b.queue for b in self.bindings if b.routing_key == routing_key]
        else:
            matched = [b.queue for b in self.bindings if topic_matches(b.routing_key, routing_key)]
        return list(dict.fromkeys(matched))
