"""An error element too large for an AMQP header frame: RabbitMQ closes the whole connection that publishes it
(FRAME_ERROR frame_too_large; frame_max is 128 KiB and the error element travels in the headers), so a client
that made a server quote 200 KB of its request in an error (an unknown command's name, a field name a model
forbids) cut the server's connection with one call: its consumers, reply queue and requests in hand."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from harness import HANG
from qbroker import InvalidParams, RequestFailed, UnknownCommand
from qbroker.errors import MAX_ERROR_TEXT


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int = 0


async def test_a_quoted_request_never_cuts_the_servers_connection(make_unit: Any) -> None:
    server = await make_unit("test.quoting")
    endpoint = server.commands("test.quoting")

    @endpoint.command("known")
    async def known(request: Strict) -> int:
        return request.n

    @server.rpc("test.echo_error")
    async def echo_error(text: str) -> None:
        raise RequestFailed("told", text, detail=text)

    await server.start()
    connection = server.bus.connection
    client = await make_unit("test.quoting.client")
    await client.start()
    huge = "x" * 200_000
    with pytest.raises(UnknownCommand) as unknown:
        await client.call("test.quoting", {"command": huge}, timeout=HANG)
    with pytest.raises(InvalidParams) as invalid:
        await client.call("test.quoting", {"command": "known", huge: 1}, timeout=HANG)
    with pytest.raises(RequestFailed) as told:
        await client.call("test.echo_error", {"text": "é" * 200_000}, timeout=HANG)  # 2 bytes a character
    for error in (unknown.value, invalid.value, told.value):
        assert len(error.message) <= MAX_ERROR_TEXT and len(error.detail or "") <= MAX_ERROR_TEXT, error.id
    assert told.value.message.startswith("éé") and told.value.message.endswith("…")
    assert await client.call("test.quoting", {"command": "known", "n": 7}, timeout=HANG) == 7
    assert server.bus.connection is connection  # never lost
