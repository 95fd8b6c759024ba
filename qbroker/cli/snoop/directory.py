"""The units ``qbroker-debug`` knows about, and the bindings that following them requires.

Why per-name bindings instead of ``#``: the core declares ``rpc`` and ``alert`` with ``dead`` as their
alternate exchange, so an unroutable request is dead-lettered (and answered ``no_server``) and an
unheard alert is counted in ``dead``. A debugger queue bound with ``#`` would make every message
routable and silently change that. Binding exactly the endpoint names and listener patterns the units
announce never changes where a message goes; unroutable messages are still seen, via ``dead``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Discovery alerts we always follow (qbroker.ping is listened to by every unit anyway).
DISCOVERY_ALERTS = frozenset({"qbroker.start", "qbroker.stop", "qbroker.ping"})


@dataclass
class UnitInfo:
    app: str
    uuid: str
    host: str | None = None
    endpoints: frozenset[str] = frozenset()
    listeners: frozenset[str] = frozenset()


@dataclass
class Desired:
    """Routing keys our traffic queue should be bound with, per exchange role."""

    rpc: set[str] = field(default_factory=set)
    alert: set[str] = field(default_factory=set)
    reply: set[str] = field(default_factory=set)

    def keys(self, role: str) -> set[str]:
        return getattr(self, role)  # type: ignore[no-any-return]


def _names(value: Any, *, patterns: bool = False) -> frozenset[str]:
    """Announced names we may bind. Announcements are alerts anyone can forge: an endpoint "name" of
    ``#`` would make every request routable to our queue, so unroutable ones would no longer reach
    ``dead`` (no ``no_server``). Endpoint names with a wildcard word are refused; listener patterns
    may use wildcards but not consist of them only."""
    if isinstance(value, dict):
        items = list(value)
    elif isinstance(value, list | tuple | set):
        items = list(value)
    else:
        return frozenset()
    return frozenset(v for v in items if isinstance(v, str) and _bindable(v, patterns=patterns))


def _bindable(name: str, *, patterns: bool) -> bool:
    words = name.split(".")
    if not name or len(name) > 255 or any(not w for w in words):
        return False
    wild = [w in ("*", "#") for w in words]
    return not any(wild) if not patterns else not all(wild)


class UnitDirectory:
    def __init__(self, own_uuid: str, *, everything: bool = False) -> None:
        self.own_uuid = own_uuid
        self.everything = everything  # --all: bind '#' (documented as changing unroutable handling)
        self.units: dict[str, UnitInfo] = {}
        self.callers: set[str] = set()  # reply-to uuids seen on requests from non-announced clients

    def learn(self, info: dict[str, Any]) -> UnitInfo | None:
        """From a ``qbroker.start`` alert body or a ``qbroker.ping`` reply body."""
        uuid = info.get("uuid")
        if not isinstance(uuid, str) or not uuid or uuid == self.own_uuid:
            return None
        unit = UnitInfo(
            app=str(info.get("app") or "?"),
            uuid=uuid,
            host=str(info["host"]) if info.get("host") is not None else None,
            endpoints=_names(info.get("endpoints")),
            listeners=_names(info.get("listeners"), patterns=True),
        )
        self.units[uuid] = unit
        self.callers.discard(uuid)
        return unit

    def forget(self, uuid: str | None) -> UnitInfo | None:
        """After ``qbroker.stop``."""
        if not isinstance(uuid, str) or not uuid:
            return None
        self.callers.discard(uuid)
        return self.units.pop(uuid, None)

    def follow_caller(self, uuid: str | None) -> bool:
        """A request's reply-to we do not follow yet: follow it so later replies are seen."""
        if not uuid or uuid == self.own_uuid or uuid in self.units or uuid in self.callers:
            return False
        self.callers.add(uuid)
        return True

    def app_of(self, uuid: str | None) -> str | None:
        unit = self.units.get(uuid or "")
        return unit.app if unit else None

    def desired(self) -> Desired:
        desired = Desired(reply=set(self.units) | self.callers)
        if self.everything:
            desired.rpc = {"#"}
            desired.alert = {"#"}
            return desired
        desired.alert = set(DISCOVERY_ALERTS)
        for unit in self.units.values():
            desired.rpc |= unit.endpoints
            desired.alert |= unit.listeners
        return desired
