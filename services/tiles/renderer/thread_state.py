"""What a renderer process knows of each of its render threads: the metatile in hand, the wire it came by and
the wire the thread is registered on, and when a queuemaster last reached it (``process.RendererProcess``
keeps one per thread).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class RenderThread:
    threadid: int
    endpoint: str
    metatile: str | None = None
    task: asyncio.Task[None] | None = None
    last_contact: float = field(default_factory=time.monotonic)
    # Reporting a render and asking for the next metatile in the answer: idle for the queuemaster's own
    # `render` to this thread, but not for requests to a level (the answer may hand it work).
    reporting: bool = False
    wire: str = "qbroker"  # the wire its current metatile came by: its `rendered` goes back there
    # The wire it last registered on. Only a queuemaster on qbroker pings (the watchdog's contact): one that
    # took us on `osm` is never heard from unless it sends work, and says `queuemaster online` if it forgets us.
    registered_on: str = "qbroker"

    def heard_over_qbroker(self) -> None:
        """A queuemaster reached this thread over qbroker (ping, render, an answer): it is on that wire there
        (even if it was told of us on `osm` as well, or that `register` was lost)."""
        self.last_contact = time.monotonic()
        self.registered_on = "qbroker"

    def describe(self) -> dict[str, Any]:
        return {
            "renderer": self.endpoint,
            "threadid": self.threadid,
            "state": "rendering" if self.metatile else "idle",
            "metatile": self.metatile,
        }
