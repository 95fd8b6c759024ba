"""``--name GLOB``, ``--app GLOB``, ``--uuid PREFIX``, ``--kind``, ``--status``.

``--app`` and ``--uuid`` match either party of a message: the sender, or for a reply the caller it is
addressed to, so ``--app my.cli`` shows a client's requests *and* the replies it receives.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase

from qbroker.cli.exit_codes import UsageProblem
from qbroker.cli.snoop.events import KINDS, STATUSES, Event


def split_choices(values: Iterable[str], allowed: Iterable[str], option: str) -> frozenset[str]:
    """Repeated options and comma-separated lists both work: --kind request,reply --kind dead."""
    allowed = tuple(allowed)
    chosen = {part.strip() for value in values for part in value.split(",") if part.strip()}
    unknown = sorted(chosen - set(allowed))
    if unknown:
        raise UsageProblem(f"{option}: unknown value(s) {', '.join(unknown)} (choose from {', '.join(allowed)})")
    return frozenset(chosen)


@dataclass(frozen=True)
class EventFilter:
    names: tuple[str, ...] = ()
    apps: tuple[str, ...] = ()
    uuids: tuple[str, ...] = ()
    kinds: frozenset[str] = frozenset()
    statuses: frozenset[str] = frozenset()

    @classmethod
    def build(
        cls,
        names: Iterable[str] = (),
        apps: Iterable[str] = (),
        uuids: Iterable[str] = (),
        kinds: Iterable[str] = (),
        statuses: Iterable[str] = (),
    ) -> EventFilter:
        return cls(
            names=tuple(names),
            apps=tuple(apps),
            uuids=tuple(uuids),
            kinds=split_choices(kinds, KINDS, "--kind"),
            statuses=split_choices(statuses, STATUSES, "--status"),
        )

    def __call__(self, event: Event) -> bool:
        if self.kinds and event.kind not in self.kinds:
            return False
        if self.statuses and event.status not in self.statuses:
            return False
        if self.names and not any(fnmatchcase(event.name or "", glob) for glob in self.names):
            return False
        if self.apps:
            parties = [a for a in (event.app, event.to_app) if a]
            if not any(fnmatchcase(app, glob) for app in parties for glob in self.apps):
                return False
        if self.uuids:
            parties = [u for u in (event.uuid, event.to_uuid) if u]
            if not any(u.startswith(prefix) for u in parties for prefix in self.uuids):
                return False
        return True
