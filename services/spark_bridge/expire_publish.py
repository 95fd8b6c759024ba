"""Size-capped batching of expirations for the ``expire_toposm`` alert (``z/x/y;z/x/y;...``, the contract's
expiry list)."""

from __future__ import annotations

from collections.abc import Callable

from services.tiles.contract import EXPIRY_SEPARATOR, join_expiry_list


class ExpirationBatcher:
    """Joins tile names into expiry lists and hands a batch to ``send`` before it exceeds either cap."""

    def __init__(self, send: Callable[[str], None], *, max_bytes: int = 65_536, max_tiles: int = 2_000) -> None:
        if max_bytes < 32 or max_tiles < 1:
            raise ValueError("batch caps too small: max_bytes >= 32 and max_tiles >= 1")
        self._send = send
        self._max_bytes = max_bytes
        self._max_tiles = max_tiles
        self._pending: list[str] = []
        self._pending_bytes = 0
        self.messages_sent = 0
        self.tiles_sent = 0

    def add(self, tile: str) -> None:
        size = len(tile) + (len(EXPIRY_SEPARATOR) if self._pending else 0)  # names are ASCII: len == bytes
        if self._pending and (self._pending_bytes + size > self._max_bytes or len(self._pending) >= self._max_tiles):
            self.flush()
            size = len(tile)
        self._pending.append(tile)
        self._pending_bytes += size

    def flush(self) -> None:
        if not self._pending:
            return
        self._send(join_expiry_list(self._pending))
        self.messages_sent += 1
        self.tiles_sent += len(self._pending)
        self._pending = []
        self._pending_bytes = 0
