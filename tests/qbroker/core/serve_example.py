"""A service run by ``qbroker.serve`` in a child process, for tests/qbroker/core/test_runner.py.

It prints one line per lifecycle step (flushed) so the test can wait for each; with ``HANG_ON_STOP=1``
its ``stop()`` never returns, so only a second signal ends the process.
"""

from __future__ import annotations

import asyncio
import gc
import os

from qbroker import Unit, serve


class Example:
    def __init__(self, unit: Unit) -> None:
        self.unit = unit

        @unit.rpc("t.serve.where")
        async def where() -> str:
            return unit.state

        @unit.rpc("t.serve.frozen")
        async def frozen() -> int:
            return gc.get_freeze_count()

    async def start(self) -> None:
        print(f"start unit={self.unit.state}", flush=True)

    async def stop(self) -> None:
        print(f"stop unit={self.unit.state}", flush=True)
        if os.environ.get("HANG_ON_STOP") == "1":
            await asyncio.Event().wait()


if __name__ == "__main__":
    serve("test.serve", Example, drain_timeout=5)
    print("exited gracefully", flush=True)
