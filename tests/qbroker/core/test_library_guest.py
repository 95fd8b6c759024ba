"""The library as a guest in someone else's program (docs/logging.md): importing qbroker configures no
logging, and a script that uses it without ``configure_logging`` prints only what it prints itself."""

from __future__ import annotations

import asyncio
import json
import sys

GLOBAL_LOGGING = """
import json, logging, sys, threading, warnings
import structlog

def state():
    root = logging.getLogger()
    return json.dumps({
        "structlog": repr(sorted(structlog.get_config().items())),
        "structlog_configured": structlog.is_configured(),
        "root": [repr(h) for h in root.handlers] + [root.level],
        "loggers": sorted(name for name, logger in logging.root.manager.loggerDict.items()
                          if isinstance(logger, logging.Logger) and (logger.handlers or logger.level)),
        "hooks": [repr(sys.excepthook), repr(threading.excepthook), repr(warnings.showwarning)],
    })

before = state()
import qbroker, qbroker.log, qbroker.runner, qbroker.unit, qbroker.cli.main  # noqa: F401,E401
print(json.dumps([json.loads(before), json.loads(state())]))
"""

PLAIN_SCRIPT = """
import asyncio, sys
from qbroker import Config, Unit

async def main(url):
    server = Unit("guest.server", config=Config(url=url))

    @server.rpc("guest.double")
    async def double(n: int) -> int:
        return 2 * n

    client = Unit("guest.client", config=Config(url=url))
    await server.start()
    await client.start()
    print(await client.call("guest.double", {"n": 21}))
    await client.stop()
    await server.stop()

asyncio.run(main(sys.argv[1]))
"""


async def _python(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *args,
        env={"PATH": "/usr/bin:/bin"},  # no QBROKER_LOG_* of the test run's
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_importing_qbroker_configures_no_logging() -> None:
    code, out, err = await _python("-c", GLOBAL_LOGGING)
    assert code == 0, err
    before, after = json.loads(out)
    assert after == before
    assert not err


async def test_a_library_script_prints_only_what_it_asked_for(amqp_url: str) -> None:
    code, out, err = await _python("-c", PLAIN_SCRIPT, amqp_url)
    assert code == 0, err
    assert out == "42\n"
    assert err == ""  # no `connected`, no `unit started`
