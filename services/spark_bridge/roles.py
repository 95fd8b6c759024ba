"""The Spark bridge's broker role, and what clients and operators may do with it, as data for
``qbroker provision`` (entry point ``qbroker.roles``: spark_bridge). docs/security.md."""

from __future__ import annotations

import re
from typing import Any

from services.toposm.contract import (
    ALL_PROGRAMS,
    EXPIRE_TOPIC,
    OSM_EXCHANGE,
    SPARK_EXPIRE,
    SPARK_JOB,
    SPARK_PROGRESS,
    SPARK_STATS,
)

ENDPOINTS = "(" + "|".join(re.escape(name) for name in (SPARK_EXPIRE, SPARK_STATS, SPARK_JOB)) + ")"
EXPIRE = re.escape(EXPIRE_TOPIC)

ROLES: dict[str, dict[str, Any]] = {
    "spark_bridge": {
        "serve": [ENDPOINTS],
        # expirations on both wires (qbroker's alert and TopOSM's osm), progress of its jobs (named after
        # their owners' accounts, qbroker.progress)
        "alert": [EXPIRE, re.escape(SPARK_PROGRESS) + r"[A-Za-z0-9_@%-]+\.[0-9a-f]+"],
        # every program hears `toposm` (docs/tiles.md), on both wires: on `osm` in a server-named queue of its own
        "hear": [re.escape(ALL_PROGRAMS)],
        "resources": [r"amq\.gen-[A-Za-z0-9_-]+"],
        "topics": {OSM_EXCHANGE: {"write": [EXPIRE], "read": [re.escape(ALL_PROGRAMS)]}},
        # the queuemaster takes `expire` commands from the accounts listed there
        "listed_in": ["TOPOSM_EXPIRE_USERS"],
    },
    "client": {"call": [ENDPOINTS]},
    # operators see and cancel every job, not only their own
    "operator": {"listed_in": ["TOPOSM_OPERATOR_USERS"]},
}
