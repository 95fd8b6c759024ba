"""A unit of the original QBroker (trio_qbroker), driven over stdin/stdout: runs under the original's own
venv (harness/original_qbroker.py), never under qbroker's; it imports nothing from this repository.

argv[1] is a JSON object: {host, port, login, password, vhost, app, dead, debug, serve}. With ``serve`` the
unit serves, with the original's own API:
- ``orig.echo`` (rpc, CC_DATA): returns the request's data as it came (a str goes back as text/plain, a dict,
  list or None as application/json+obj, bytes as application/binary: the original's choice, not ours);
- ``orig.fail`` (rpc, CC_DATA): raises ValueError("bad value: <data>");
- ``orig.bytes`` (rpc): returns b"\\x00\\xffraw";
- ``orig.alert`` (alert listener, CC_DATA): reports what it heard and answers {"heard": data}.

Then one JSON command a line on stdin, one JSON answer a line on stdout (``{"id": n, ...}``):
- {"op": "rpc", "name", "data", "debug", "dest", "uuid", "codec", "timeout"} -> {"ok": data} | {"error": ...}
  | {"timeout": true}  (the original's rpc() waits for ever: the timeout is the agent's)
- {"op": "alert", "name", "data"} -> {"ok": null}
- {"op": "poll", "name", "data", "max_delay", "debug"} -> {"replies": [{"data"} | {"error"}]}
Spontaneous lines: {"ready": true, "uuid", "app"} once serving; {"event": "alert", "name", "data"}.
Bytes travel as {"$bytes": "<hex>"}; an error as {"type": class name, "str": str(exc)}.
"""

import json
import sys

import trio
import trio_qbroker
from trio_qbroker import CC_DATA, CC_DICT, CC_MSG


def encode(value):
    if isinstance(value, bytes):
        return {"$bytes": value.hex()}
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return {"$repr": repr(value)}


def decode(value):
    if isinstance(value, dict):
        if set(value) == {"$bytes"}:
            return bytes.fromhex(value["$bytes"])
        return {k: decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode(v) for v in value]
    return value


def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def error_of(exc):
    return {"type": type(exc).__name__, "str": str(exc)}


async def serve(unit):
    def echo(data):
        return data

    def fail(data):
        raise ValueError(f"bad value: {data}")

    def raw():
        return b"\x00\xffraw"

    def heard(data):
        say({"event": "alert", "name": "orig.alert", "data": encode(data)})
        return {"heard": data}

    await unit.register(echo, "orig.echo", call_conv=CC_DATA)
    await unit.register(fail, "orig.fail", call_conv=CC_DATA)
    await unit.register(raw, "orig.bytes", call_conv=CC_DICT)
    await unit.register(heard, "orig.alert", call_conv=CC_DATA, multiple=True)


async def run_command(unit, command):
    op = command["op"]
    data = decode(command.get("data"))
    options = {}
    for key in ("dest", "uuid", "codec"):
        if command.get(key) is not None:
            options[key] = command[key]
    if op == "rpc":
        with trio.move_on_after(command.get("timeout", 10)):
            try:
                result = await unit.rpc(command["name"], data, debug=command.get("debug", False), **options)
            except Exception as exc:
                return {"error": error_of(exc)}
            return {"ok": encode(result)}
        return {"timeout": True}
    if op == "alert":
        await unit.alert(command["name"], data, **options)
        return {"ok": None}
    if op == "poll":
        replies = []
        async for msg in unit.poll(
            command["name"],
            data,
            max_delay=command.get("max_delay", 1.0),
            result_conv=CC_MSG,
            debug=command.get("debug", False),
            **options,
        ):
            if msg.error is not None:
                replies.append(
                    {
                        "error": {
                            "cls": getattr(msg.error, "cls", None),
                            "message": getattr(msg.error, "message", None),
                            "status": getattr(msg.error, "status", None),
                        }
                    }
                )
            else:
                replies.append({"data": encode(msg.data)})
        return {"replies": replies}
    return {"error": {"type": "UnknownOp", "str": op}}


async def main():
    settings = json.loads(sys.argv[1])
    cfg = {
        "amqp": {
            "server": {
                "host": settings["host"],
                "port": settings["port"],
                "login": settings["login"],
                "password": settings["password"],
                "virtualhost": settings["vhost"],
            },
            "handlers": {"dead": settings.get("dead", True), "debug": settings.get("debug", True)},
        }
    }
    async with trio_qbroker.open_broker(settings["app"], cfg=cfg) as unit:
        if settings.get("serve", True):
            await serve(unit)
        await unit.wait_queue()
        say({"ready": True, "uuid": unit.uuid, "app": unit.app})
        while True:
            line = await trio.run_sync_in_worker_thread(sys.stdin.readline)
            if not line:
                break
            command = json.loads(line)
            if command["op"] == "quit":
                break
            try:
                answer = await run_command(unit, command)
            except Exception as exc:  # the agent's own problem: said, not fatal
                answer = {"error": error_of(exc), "agent": True}
            answer["id"] = command.get("id")
            say(answer)
    say({"stopped": True})


if __name__ == "__main__":
    trio.run(main)
