"""The renderer's side of `next`: it asks for its next metatile with `rendered`, unless the queuemaster
is from before the field (it refuses unknown fields): then it reports the old way from then on."""

from qbroker import Config, InvalidParams, Unit
from services.tiles.renderer.process import RendererProcess
from services.tiles.renderer.settings import RendererSettings


async def test_a_queuemaster_refusing_next_is_reported_to_the_old_way(tmp_path):
    unit = Unit("test.renderer", config=Config(url="amqp://guest:guest@127.0.0.1:5672/unused"))  # never started
    renderer = RendererProcess(unit, RendererSettings(tile_root=tmp_path, hostname="h"))
    sent = []

    async def old_queuemaster(name, body, timeout=None):
        sent.append(dict(body))
        if "next" in body:
            raise InvalidParams(
                "invalid parameters for toposm.queuemaster:rendered: next: Extra inputs are not permitted"
            )
        return {"command": "ack", "metatile": body["metatile"], "expected": True, "queued_again": False}

    unit.call = old_queuemaster  # type: ignore[method-assign]
    try:
        thread = renderer.threads[0]
        answer = await renderer._report(thread, {"command": "rendered", "metatile": "5/0/0", "next": True})
        assert answer["expected"] and not renderer.ask_next
        assert [("next" in body) for body in sent] == [True, False]  # refused once, then without it
        await renderer._report(thread, {"command": "rendered", "metatile": "5/1/0", "next": True})
        assert "next" not in sent[-1] and len(sent) == 3  # not asked again
    finally:
        renderer._pool.shutdown(wait=False)
