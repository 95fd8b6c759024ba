"""Is a render thread on the ``osm`` wire still there? Asked of the broker, never of the thread.

The TopOSM protocol (docs/tiles.md) defines nothing a render thread answers besides ``render`` (with a later
``rendered``), so a thread written to it alone must not be asked ``ping``. Its ``reply_to`` is its own queue, and
the broker knows that queue: a passive declare of it answers

* NOT_FOUND: the queue is gone (an exclusive or auto-delete queue dies with its connection): the thread
  is gone;
* RESOURCE_LOCKED: the queue is exclusive to another connection, which is therefore still open: alive;
* the queue's consumer count otherwise: a thread consumes its queue while it runs; a durable queue left
  behind by a dead program has none.

Each probe takes a channel of its own, since a failed passive declare closes the channel it ran on.
"""

from __future__ import annotations

import enum

from aio_pika.abc import AbstractConnection
from aiormq.exceptions import ChannelLockedResource, ChannelNotFoundEntity


class QueueLiveness(enum.Enum):
    CONNECTED = "connected"  # exclusive to an open connection, or consumed
    UNCONSUMED = "unconsumed"  # there, but nobody consumes it (counts as a miss)
    GONE = "gone"


async def probe_queue(connection: AbstractConnection, name: str) -> QueueLiveness:
    """What the broker says about the queue ``name`` (see the module's docstring); transport errors raise."""
    channel = await connection.channel()
    try:
        queue = await channel.declare_queue(name, passive=True)
    except ChannelNotFoundEntity:
        return QueueLiveness.GONE
    except ChannelLockedResource:
        return QueueLiveness.CONNECTED
    finally:
        if not channel.is_closed:
            await channel.close()
    consumers = queue.declaration_result.consumer_count
    return QueueLiveness.CONNECTED if consumers else QueueLiveness.UNCONSUMED
