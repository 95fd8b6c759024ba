"""What every RPC contender of bench/peers_rpc.py echoes, and the shape of a contender: its ``serve(url)``
returns a stop function, its ``connect(url)`` a client's ``call()`` and its stop function.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

PAYLOAD: dict[str, Any] = {"text": "hello", "n": 1}
PAYLOAD_BYTES = orjson.dumps(PAYLOAD)
Stop = Callable[[], Awaitable[object]]
Call = Callable[[], Awaitable[object]]


@dataclass(frozen=True)
class Contender:
    name: str
    serve: Callable[[str], Awaitable[Stop]]
    connect: Callable[[str], Awaitable[tuple[Call, Stop]]]
