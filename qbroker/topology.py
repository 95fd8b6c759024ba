"""The bus's shared exchanges and queues, written once: what ``qbroker provision`` declares and units check.

Shared objects are used by every unit and owned by none (docs/wire-format.md, "Exchanges and queues"):

- ``rpc``   topic, routing key = request name; alternate exchange ``dead`` catches unroutable requests.
- ``reply`` direct, routing key = the caller's uuid.
- ``alert`` topic, routing key = alert name; alternate exchange ``dead`` so unheard alerts are counted.
- ``dead``  fanout, with the durable ``dead`` queue bound to it.
- ``dead.kept.in`` fanout, with the durable ``dead.kept`` queue bound to it, which nobody consumes: the
  collector that takes a dead request copies it there, for operators to list and replay (``dead_kept``).
- every other topic exchange a role has grants on (TopOSM's ``osm``): topic, durable.

Declaring one needs the broker's configure permission on its name, which no role has (docs/security.md):
``qbroker provision`` declares them, and a unit finds them with a passive declare, which needs none
(``topology_check``). Another program (the original QBroker, another client of the protocol) may have declared one with
other settings; the broker then refuses a re-declare naming one difference (PRECONDITION_FAILED,
``inequivalent arg ...``): ``read_difference`` reads that text, ``Difference.cost`` says what using the
object as it is costs, and ``adopt`` gives the declaration that matches it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from qbroker.config import Config

BIND_ALL = "#"  # a fanout exchange ignores the key; a topic one (the original QBroker's `dead`) needs it
FLAGS = ("type", "durable", "auto_delete")  # the settings that are not arguments


class _Absent:
    def __repr__(self) -> str:
        return "none"


ABSENT: Any = _Absent()  # a setting the object does not have (an argument nobody gave)


@dataclass(frozen=True)
class Shared:
    """One exchange (``type`` set) or queue (``type`` None) as qbroker declares it.

    ``required``: settings qbroker cannot work without, with the values that do (an ``rpc`` that is not a
    topic exchange routes wrongly); any other difference is used as it is, with a warning. ``costs``: what
    using the object without one of its settings costs, by setting, where the generic text says too little.
    ``bindings``: (exchange, routing key) a queue is bound with."""

    name: str
    type: str | None = None
    arguments: Mapping[str, Any] = field(default_factory=dict)
    durable: bool = True
    auto_delete: bool = False
    bindings: tuple[tuple[str, str], ...] = ()
    required: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    costs: Mapping[str, str] = field(default_factory=dict)

    @property
    def kind(self) -> Literal["exchange", "queue"]:
        return "queue" if self.type is None else "exchange"

    def setting(self, name: str) -> Any:
        if name in FLAGS:
            return getattr(self, name)
        return self.arguments.get(name, ABSENT)

    def adopt(self, difference: Difference) -> Shared:
        """This declaration with the existing object's value of the one setting ``difference`` names."""
        if difference.setting in FLAGS:
            return replace(self, **{difference.setting: difference.theirs})
        arguments = {k: v for k, v in self.arguments.items() if k != difference.setting}
        if difference.theirs is not ABSENT:
            arguments[difference.setting] = difference.theirs
        return replace(self, arguments=arguments)

    def __str__(self) -> str:
        return f"{self.kind} {self.name!r}"


def shared_topology(config: Config, topic_exchanges: tuple[str, ...] = ()) -> list[Shared]:
    """The shared objects of the bus ``config`` names, in the order they are declared (an exchange before
    the queues bound to it), plus ``topic_exchanges`` (the service-owned ones roles name, e.g. ``osm``)."""
    dead = config.exchange_name("dead")
    kept_in = config.dead_kept_exchange_name
    no_dead_check = {
        "alternate-exchange": "a call to a name nobody serves waits for its timeout instead of "
        "being answered no_server at once"
    }
    return [
        Shared(
            dead,
            "fanout",
            required={"type": ("fanout", "topic")},
            costs={"type": "none: the dead queue is bound with '#', so a topic exchange gives it every key"},
        ),
        Shared(config.dead_queue_name, arguments=dead_queue_arguments(config), bindings=((dead, BIND_ALL),)),
        Shared(kept_in, "fanout", required={"type": ("fanout", "topic")}),
        Shared(
            config.dead_kept_queue_name,
            arguments=dead_kept_arguments(config),
            bindings=((kept_in, BIND_ALL),),
            costs={
                "*": "the kept copies of dead requests are bounded otherwise (delete the queue once, or set "
                "a policy, to apply these bounds)"
            },
        ),
        Shared(
            config.exchange_name("rpc"),
            "topic",
            {"alternate-exchange": dead},
            required={"type": ("topic",)},
            costs=no_dead_check,
        ),
        Shared(config.exchange_name("reply"), "direct", required={"type": ("direct",)}),
        Shared(
            config.exchange_name("alert"),
            "topic",
            {"alternate-exchange": dead},
            required={"type": ("topic",)},
            costs={"alternate-exchange": "alerts nobody listens to are dropped unseen instead of counted as dead"},
        ),
        *(topic_exchange(name) for name in topic_exchanges),
    ]


def topic_exchange(name: str, costs: Mapping[str, str] | None = None) -> Shared:
    """A service's shared topic exchange (TopOSM's ``osm``): durable, no arguments; ``costs`` as in
    ``Shared`` (the service knows what a difference costs it)."""
    return Shared(name, "topic", required={"type": ("topic",)}, costs=costs or {})


def dead_queue_arguments(config: Config) -> dict[str, Any]:
    return {"x-message-ttl": config.dead_queue_ttl_ms, **config.durable_queue_type()}


def dead_kept_arguments(config: Config) -> dict[str, Any]:
    return {
        "x-max-length": config.dead_kept_max,
        "x-max-length-bytes": config.dead_kept_max_bytes,
        "x-message-ttl": config.dead_kept_ttl_ms,
        "x-overflow": "drop-head",
        **config.durable_queue_type(),
    }


# -- differences ----------------------------------------------------------------------------------------

_INEQUIVALENT = re.compile(
    r"inequivalent arg '(?P<setting>[^']+)' for (?P<kind>exchange|queue) '(?P<name>.*)' "
    r"in vhost '.*': received (?P<received>.+?) but current is (?P<current>.+)$",
    re.S,
)
_TYPED = re.compile(r"the value '(?P<value>.*)' of type '(?P<type>\w+)'", re.S)
_INTEGER_TYPES = {"byte", "short", "signedint", "long", "unsignedbyte", "unsignedshort", "unsignedint", "longlong"}
_GENERIC_COSTS = {
    ("durable", False): "it is gone after a broker restart, with what it holds and its bindings",
    ("auto_delete", True): "the broker deletes it once its last consumer or binding goes",
    ("x-message-ttl", ABSENT): "messages wait in it without a time limit",
    ("x-message-ttl", None): "messages waiting longer than {theirs} ms are dropped or dead-lettered",
    ("x-expires", ABSENT): "it stays after its last consumer has gone: callers of a stopped service wait for "
    "their timeout instead of being answered no_server",
    ("x-expires", None): "the broker deletes it {theirs} ms after its last consumer has gone",
    ("x-queue-type", None): "its replication differs from this deployment's QBROKER_QUEUE_TYPE",
    ("x-dead-letter-exchange", ABSENT): "what expires or is rejected in it is dropped, not answered as dead",
    ("x-max-priority", ABSENT): "requests are not taken by priority",
}


class UnreadableValue(str):
    """A value in a broker's refusal text that could not be read back as a setting (shown as it was)."""


@dataclass(frozen=True)
class Difference:
    """One setting in which an existing object differs from qbroker's declaration of it."""

    shared: Shared
    setting: str
    ours: Any
    theirs: Any

    @property
    def readable(self) -> bool:
        return not isinstance(self.theirs, UnreadableValue)

    @property
    def required(self) -> bool:
        """qbroker cannot use the object so: its value is none of those it works with."""
        allowed = self.shared.required.get(self.setting)
        return allowed is not None and (not self.readable or self.theirs not in allowed)

    def cost(self) -> str:
        costs = self.shared.costs
        text = costs.get(self.setting) or (costs.get("*") if self.setting not in FLAGS else None)
        if text is None:
            text = (
                (_GENERIC_COSTS.get((self.setting, self.theirs)) if _hashable(self.theirs) else None)
                or _GENERIC_COSTS.get((self.setting, None))
                or "it behaves as the program that declared it chose"
            )
        return text.format(theirs=self.theirs)

    def __str__(self) -> str:
        return f"{self.shared}: {self.setting} is {_show(self.theirs)} there, qbroker declares {_show(self.ours)}"


def read_difference(shared: Shared, refusal: str) -> Difference | None:
    """The difference a broker's PRECONDITION_FAILED text names for ``shared``, or None if the text is not
    RabbitMQ's ``inequivalent arg`` refusal for that object."""
    match = _INEQUIVALENT.search(refusal)
    if match is None or match["name"] != shared.name or match["kind"] != shared.kind:
        return None
    setting = match["setting"]
    ours = shared.setting(setting)
    return Difference(shared, setting, ours, _value(match["current"].strip(), like=ours, setting=setting))


def _value(text: str, *, like: Any, setting: str) -> Any:
    """A setting's value as the broker's refusal prints it: ``none``, ``'v'`` or ``the value 'v' of type 't'``."""
    if text == "none":
        return ABSENT
    typed = _TYPED.fullmatch(text)
    if typed is not None:
        value, kind = typed["value"], typed["type"]
        if kind in _INTEGER_TYPES and re.fullmatch(r"-?[0-9]+", value):
            return int(value)
        if kind == "bool" and value in ("true", "false"):
            return value == "true"
        return value if kind in ("longstr", "shortstr") else UnreadableValue(text)
    if not (len(text) >= 2 and text[0] == text[-1] == "'"):
        return UnreadableValue(text)
    value = text[1:-1]
    if setting in ("durable", "auto_delete") or isinstance(like, bool):
        return value == "true" if value in ("true", "false") else UnreadableValue(text)
    if isinstance(like, int):
        return int(value) if re.fullmatch(r"-?[0-9]+", value) else UnreadableValue(text)
    return value


def differences(shared: Shared, listed: Mapping[str, Any]) -> list[Difference]:
    """How an object as ``rabbitmqctl list_exchanges/list_queues --formatter json`` lists it differs from
    ``shared`` (``qbroker provision``: a definitions import keeps an existing object as it is)."""
    arguments = {entry[0]: entry[2] for entry in listed.get("arguments") or [] if len(entry) == 3}
    found = []
    for setting in ("type", "durable", "auto_delete") if shared.type is not None else ("durable", "auto_delete"):
        if listed.get(setting) != getattr(shared, setting):
            found.append(Difference(shared, setting, getattr(shared, setting), listed.get(setting)))
    for key in sorted(set(shared.arguments) | set(arguments)):
        ours, theirs = shared.arguments.get(key, ABSENT), arguments.get(key, ABSENT)
        if ours != theirs:
            found.append(Difference(shared, key, ours, theirs))
    return found


def _hashable(value: Any) -> bool:
    return isinstance(value, str | int | float | bool | _Absent)


def _show(value: Any) -> str:
    if value is ABSENT:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    return value if isinstance(value, UnreadableValue) else repr(value)
