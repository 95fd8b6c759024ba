"""The bus's shared exchanges and queues as RabbitMQ definitions: what ``qbroker provision`` declares.

No role may configure them (``qbroker.cli.deployment``), so they are declared here, once, with the arguments
``qbroker.topology`` writes for every unit (read from the environment's ``QBROKER_*`` settings, e.g.
``QBROKER_QUEUE_TYPE``, and the deployment's exchange prefix), plus every topic exchange a role has grants
on (TopOSM's ``osm``). A definitions import keeps an object that exists already as it is, whatever
its settings: what differs is read back (``rabbitmqctl list_exchanges/list_queues``) and named with its cost.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from qbroker.cli.deployment import Deployment
from qbroker.cli.roles import RoleBook
from qbroker.config import Config
from qbroker.topology import Difference, Shared, differences, shared_topology


def topology_for(deployment: Deployment, roles: RoleBook) -> list[Shared]:
    config = Config(exchange_prefix=deployment.exchange_prefix)
    return shared_topology(config, tuple(roles.exchanges()))


def definitions(shared: Iterable[Shared], vhost: str) -> dict[str, list[dict[str, Any]]]:
    """The ``exchanges``, ``queues`` and ``bindings`` of a RabbitMQ definitions file for ``shared``."""
    out: dict[str, list[dict[str, Any]]] = {"exchanges": [], "queues": [], "bindings": []}
    for item in shared:
        common = {
            "name": item.name,
            "vhost": vhost,
            "durable": item.durable,
            "auto_delete": item.auto_delete,
            "arguments": dict(item.arguments),
        }
        if item.type is not None:
            out["exchanges"].append({**common, "type": item.type, "internal": False})
            continue
        out["queues"].append(common)
        out["bindings"].extend(
            {
                "source": exchange,
                "vhost": vhost,
                "destination": item.name,
                "destination_type": "queue",
                "routing_key": key,
                "arguments": {},
            }
            for exchange, key in item.bindings
        )
    return out


def compare(
    shared: Iterable[Shared], exchanges: Sequence[Mapping[str, Any]], queues: Sequence[Mapping[str, Any]]
) -> list[Difference] | None:
    """How the listed objects differ from ``shared``; None while one is not listed yet (the broker applies
    an import asynchronously)."""
    listed = {("exchange", e.get("name")): e for e in exchanges} | {("queue", q.get("name")): q for q in queues}
    found: list[Difference] = []
    for item in shared:
        entry = listed.get((item.kind, item.name))
        if entry is None:
            return None
        found.extend(differences(item, entry))
    return found
