"""The broker roles of the TopOSM tile services, as data for ``qbroker provision`` (entry point
``qbroker.roles``: tiles). What each may do and why: docs/security.md.

Names are regexes over routing keys, matched whole (qbroker.cli.roles). A host word never holds '*' or '#':
topic read is checked on the binding key itself, and a renderer binding ``toposm.render.*.1.0`` would
receive other hosts' render commands. ``osm`` is in no role's resources: ``qbroker provision`` declares it
(every exchange roles have ``topics`` on), and nobody may configure it.
"""

from __future__ import annotations

import re
from typing import Any

from .contract import (
    ALL_PROGRAMS,
    CLIENT_REPLY_PREFIX,
    EXPIRE_TOPIC,
    OSM_EXCHANGE,
    QUEUEMASTER,
    QUEUEMASTER_OSM_QUEUE,
    RENDER_ROOT,
)

WORD = r"[^.*#]+"
ALL, EXPIRE, QM, ROOT = (re.escape(name) for name in (ALL_PROGRAMS, EXPIRE_TOPIC, QUEUEMASTER, RENDER_ROOT))
# The levels above the threads (toposm.render, .<host>, .<host>.<pid>) are endpoints too: a request there
# reaches one idle thread below (the protocol's hierarchy, docs/tiles.md), and any of them is "a render thread".
RENDER_LEVELS = ROOT + r"(\." + WORD + r"(\.[0-9]+)?)?"
RENDER_ANY = ROOT + r"(\." + WORD + r"(\.[0-9]+(\.[0-9]+)?)?)?"
# what a render process hears: toposm and every level of toposm.render.<host>.<pid>.<thread>
RENDER_HEARS = ALL + r"(\.render(\." + WORD + r"){0,3})?"
SERVER_NAMED = r"amq\.gen-[A-Za-z0-9_-]+"  # a queue the broker named (a client's reply queue on the `osm` wire)

ROLES: dict[str, dict[str, Any]] = {
    "queuemaster": {
        "serve": [QM],
        "call": [RENDER_ANY],
        # `render`/`ping` to render threads: the queuemaster's alone, not even an operator's (a renderer
        # checks the sender's account against TOPOSM_QUEUEMASTER_USERS too)
        "reserved_calls": [RENDER_ANY],
        # expirations heard on one wire only are relayed to the other (services/toposm/expiry_wires.py)
        "alert": [ALL, EXPIRE],
        "hear": [ALL, EXPIRE],
        # the `osm` wire: its durable queue there, and answers by queue name on the default exchange
        "resources": [re.escape(QUEUEMASTER_OSM_QUEUE)],
        "default_exchange": True,
        "topics": {OSM_EXCHANGE: {"write": [ALL, EXPIRE], "read": [QM, EXPIRE, ALL]}},
        "listed_in": ["TOPOSM_QUEUEMASTER_USERS"],
    },
    "renderer": {
        "call": [QM],
        "serve": [RENDER_ANY],
        # A redelivered request is re-published to the name it came to: the shared levels. Not to single
        # threads (exclusive queues, never redelivered elsewhere): what a renderer may so send to a level,
        # other renderers refuse unless it comes from the queuemaster's account (TOPOSM_QUEUEMASTER_USERS).
        "republish": [RENDER_LEVELS],
        "hear": [RENDER_HEARS],
        # the `osm` wire too: registers and reports to the queuemaster, hears the same levels, on a
        # broker-named queue of its own (services/tiles/renderer/osm_side.py)
        "resources": [SERVER_NAMED],
        "topics": {OSM_EXCHANGE: {"write": [QM], "read": [RENDER_HEARS]}},
        "listed_in": ["TOPOSM_RENDERER_USERS"],
    },
    # A person or program asking for tiles; on the `osm` wire with a server-named reply queue of its own or
    # one of the documented client prefix (services/toposm/seed_wire.py), hearing expirations there, and
    # `toposm` on both wires, where every running program listens (toposm-render-list, toposm-replicate).
    "client": {
        "call": [QM],
        "hear": [ALL],
        "resources": [SERVER_NAMED, re.escape(CLIENT_REPLY_PREFIX) + "[A-Za-z0-9_-]+"],
        "topics": {OSM_EXCHANGE: {"write": [QM], "read": [EXPIRE, ALL]}},
    },
    # Renderers take control alerts (shutdown) from operators only; operators may expire.
    "operator": {"listed_in": ["TOPOSM_OPERATOR_USERS", "TOPOSM_EXPIRE_USERS"]},
}
