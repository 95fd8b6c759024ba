"""The TopOSM contract: what every program that talks tiles on the bus agrees on, written once.

The queuemaster, the renderers, the Spark bridge, toposm-web and the benchmarks import these names instead
of spelling them. A leaf: nothing here imports anything of the project (or anything but the standard library),
so any of them can use it without pulling in another's code.

- **Names** (docs/tiles.md, "The TopOSM protocol"): the ``osm`` topic exchange, where every program listens
  on ``toposm`` and expirations go to ``expire_toposm``; the queuemaster, ``toposm.queuemaster`` (its qbroker
  endpoint, its routing key on ``osm`` and its app id there are the same name); render threads below
  ``toposm.render.<host>.<pid>.<thread>``. qbroker's ``alert`` exchange carries ``expire_toposm`` too. The
  Spark bridge's endpoints ``spark.expire``, ``spark.stats``, ``spark.job`` and its
  ``spark.progress.<owner>.<job>`` alerts (called by toposm-web, toposm-replicate and people).
- **The expiry list**: tiles ``z/x/y`` separated by ``;`` (a newline is tolerated as a separator, blanks and
  empty items are ignored), as text. Its parsers with range checks are ``tilemath.parse_tile_list`` and the
  queuemaster's ``expiry_keys``; both split as ``split_expiry_list`` does.
- **Metatiles**: a render draws 8x8 tiles (``METATILE_SHIFT``); metatile ``z/mx/my`` is tile
  ``z/(mx << 3)/(my << 3)`` and the ones beside it.
- **Metatile keys**: one int per metatile, ``z << 56 | mx << 28 | my`` (the queue's SQLite key and the
  queuemaster's dictionaries; 28 bits per coordinate hold zoom 30 metatiles).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

OSM_EXCHANGE = "osm"
EXPIRE_TOPIC = "expire_toposm"
ALL_PROGRAMS = "toposm"
QUEUEMASTER = "toposm.queuemaster"
RENDER_ROOT = "toposm.render"
# The queuemaster's durable queue on ``osm`` (bound to its name, expirations and ``toposm``).
QUEUEMASTER_OSM_QUEUE = QUEUEMASTER + ".osm"
# A client's own reply queue name on ``osm``, if it wants one rather than a broker-named ``amq.gen-...`` queue
# (any other name it declared is answered too, but this one is in the TopOSM namespace and the roles allow it).
CLIENT_REPLY_PREFIX = "toposm.reply."


class Command(StrEnum):
    """The words of TopOSM's ``{"command": <word>, ...}`` messages, requests and answers (docs/wire-format.md).

    A member is a ``str``: it compares equal to the word and is sent as the word."""

    # to the queuemaster (each with its request model in services.toposm.messages)
    REGISTER = "register"
    RENDERED = "rendered"  # also the answer to render and bulk
    UNREGISTER = "unregister"
    RENDER = "render"  # also the queuemaster's order to a render thread
    EXPIRE = "expire"
    STATS = "stats"  # also the answer's word
    BULK = "bulk"
    CANCEL = "cancel"
    # the queuemaster's answers
    REGISTERED = "registered"
    UNREGISTERED = "unregistered"
    ACK = "ack"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    # a render thread's commands and answers
    PING = "ping"
    PONG = "pong"
    ACCEPTED = "accepted"
    # said to every program (``toposm``, control alerts); the protocol defines the first: the queuemaster online
    QUEUEMASTER_ONLINE = "queuemaster online"
    STATUS = "status"
    SHUTDOWN = "shutdown"
    SHUTTING_DOWN = "shutting down"


class SparkJobCommand(StrEnum):
    """The commands of the Spark bridge's ``spark.job`` endpoint (docs/spark-bridge.md)."""

    STATUS = "status"
    PROGRESS = "progress"
    RESULT = "result"
    LOG = "log"
    CANCEL = "cancel"
    LIST = "list"


SPARK_BRIDGE = "spark.bridge"  # the bridge's app name
SPARK_EXPIRE = "spark.expire"
SPARK_STATS = "spark.stats"
SPARK_JOB = "spark.job"
# + the owner's account as one word (qbroker.progress.owner_word) + "." + the job id
SPARK_PROGRESS = "spark.progress."

EXPIRY_SEPARATOR = ";"
METATILE_SHIFT = 3
METATILE_SIZE = 1 << METATILE_SHIFT  # tiles per metatile side

KEY_ZOOM_SHIFT = 56
KEY_COORD_BITS = 28
KEY_COORD_MASK = (1 << KEY_COORD_BITS) - 1
# The packing as an SQL expression over columns z, mx and my (SQLite's << and | are the same as Python's).
KEY_SQL = f"(z << {KEY_ZOOM_SHIFT}) | (mx << {KEY_COORD_BITS}) | my"


def metatile_key(z: int, mx: int, my: int) -> int:
    return (z << KEY_ZOOM_SHIFT) | (mx << KEY_COORD_BITS) | my


def unpack_key(key: int) -> tuple[int, int, int]:
    """``(z, mx, my)`` of a metatile key."""
    return key >> KEY_ZOOM_SHIFT, (key >> KEY_COORD_BITS) & KEY_COORD_MASK, key & KEY_COORD_MASK


def render_thread(hostname: str, pid: int, threadid: int) -> str:
    """A render thread's name (its qbroker endpoint and its routing key on ``osm``)."""
    return f"{RENDER_ROOT}.{hostname}.{pid}.{threadid}"


def render_levels(hostname: str, pid: int) -> tuple[str, ...]:
    """The levels above a process's threads: ``toposm.render``, ``.<host>``, ``.<host>.<pid>`` (a request to
    one reaches one idle thread below it)."""
    return (RENDER_ROOT, f"{RENDER_ROOT}.{hostname}", f"{RENDER_ROOT}.{hostname}.{pid}")


def metric_label(name: str) -> str:
    """A name as a metric label (docs/metrics.md), without what changes with every process or job, so a
    restarted renderer continues its series: a render thread ``toposm.render.<host>.<pid>.<thread>`` as
    ``toposm.render.<host>.*.<thread>``, a renderer's own level ``toposm.render.<host>.<pid>`` as
    ``toposm.render.<host>.*``, a job's progress ``spark.progress.<owner>.<job>`` as
    ``spark.progress.<owner>.*``; any other name as itself."""
    if name.startswith(RENDER_ROOT + "."):
        words = name.split(".")
        if len(words) in (4, 5):  # the root's two words, the host, the process id, the thread
            words[3] = "*"
            return ".".join(words)
    elif name.startswith(SPARK_PROGRESS):
        owner, dot, _ = name[len(SPARK_PROGRESS) :].partition(".")
        if dot:
            return f"{SPARK_PROGRESS}{owner}.*"
    return name


def split_expiry_list(text: str) -> list[str]:
    """The items of an expiry list, stripped, empty ones left out (not checked: the parsers do that)."""
    return [part.strip() for part in text.replace("\n", EXPIRY_SEPARATOR).split(EXPIRY_SEPARATOR) if part.strip()]


def join_expiry_list(tiles: Iterable[object]) -> str:
    """An expiry list of ``tiles`` (``z/x/y`` strings, or anything whose ``str`` is one)."""
    return EXPIRY_SEPARATOR.join(map(str, tiles))
