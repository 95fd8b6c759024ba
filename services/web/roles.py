"""toposm-web's broker role, as data for ``qbroker provision`` (entry point ``qbroker.roles``: web).

It calls the queuemaster's stats/render/expire (TOPOSM_EXPIRE_USERS lists it, for the map's re-render) and
the Spark job list, and hears the expirations (on both wires) and job progress it shows, and `toposm` where
every program listens; it serves nothing.
docs/security.md.
"""

from __future__ import annotations

import re
from typing import Any

from services.toposm.contract import ALL_PROGRAMS, EXPIRE_TOPIC, OSM_EXCHANGE, QUEUEMASTER, SPARK_JOB, SPARK_PROGRESS

EXPIRE = re.escape(EXPIRE_TOPIC)
ALL = re.escape(ALL_PROGRAMS)

ROLES: dict[str, dict[str, Any]] = {
    "web": {
        "call": [re.escape(QUEUEMASTER), re.escape(SPARK_JOB)],
        # the binding key itself: topic read checks it; `toposm`, where every program listens (docs/tiles.md)
        "hear": [re.escape(SPARK_PROGRESS) + "#", EXPIRE, ALL],
        # its exclusive server-named queues on `osm`, bound to expire_toposm and toposm (services/toposm/seed_wire.py)
        "resources": [r"amq\.gen-[A-Za-z0-9_-]+"],
        "topics": {OSM_EXCHANGE: {"read": [EXPIRE, ALL]}},
        "listed_in": ["TOPOSM_EXPIRE_USERS"],
    }
}
