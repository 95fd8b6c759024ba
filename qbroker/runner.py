"""Running a qbroker process: one runner owns signals, logging, uvloop, start and graceful stop.

``serve(app, make_service)`` is what every console script calls (and ``qbroker serve module:attr`` for a
library user's service): it builds the ``Unit``, lets the service register its endpoints on it, starts
both, and on SIGTERM/SIGINT stops the service, then the unit (draining running handlers up to the drain
timeout). A second signal kills at once: running
handlers are abandoned and their requests redelivered to another server.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Protocol, TypeVar

from qbroker.config import Config
from qbroker.errors import BrokerUnavailable, QBrokerError
from qbroker.exit_codes import ExitCode
from qbroker.log import bind_process, configure_logging, exit_fatal
from qbroker.settings import ProgramSettings, drop_repeated_connect_errors
from qbroker.unit import Unit

T = TypeVar("T")
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Service(Protocol):
    async def start(self) -> None:
        """Called after ``unit.start()``: connected, endpoints consuming."""

    async def stop(self) -> None:
        """Graceful: called on the first SIGTERM/SIGINT, before ``unit.stop(drain)``."""


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on uvloop when installed (faster: docs/decisions.md, "Libraries we added, and why")."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def freeze_startup_heap() -> None:
    """Move every object alive now out of the garbage collector's scans (``gc.freeze``).

    A service holds what it loaded at start-up (modules, a Spark session's py4j objects, the Arrow and
    numpy libraries) for its whole life. Left in the collector's oldest generation, each full collection
    walked all of it, a pause a diff of the Spark bridge often landed on. Frozen, a full collection walks only
    what the work since created (docs/decisions.md, "A diff writes what differs"). Garbage among the frozen
    objects is never reclaimed: acceptable for what start-up made once."""
    gc.collect()
    gc.freeze()


async def run_service(
    unit: Unit,
    service: Service,
    *,
    stop: asyncio.Event | None = None,
    drain_timeout: float | None = None,
    freeze_heap: bool = False,
) -> None:
    """Start ``unit`` and ``service``, wait for ``stop``, stop the service, then the unit (draining).

    ``freeze_heap``: once started, ``freeze_startup_heap()`` (a process of its own: ``serve`` sets it).
    The unit is always closed, also when starting fails or the task is cancelled (a second signal).
    """
    stop = stop if stop is not None else asyncio.Event()
    try:
        await unit.start()
        await service.start()
        if freeze_heap:
            freeze_startup_heap()
        await stop.wait()
        with collector_paused():
            try:
                await service.stop()
            finally:
                await unit.stop(drain_timeout)
    finally:
        await unit.kill()  # nothing to do after a clean stop


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while a service stops (``gc.disable``, restored after).

    A stop may end thousands of handlers at once (the queuemaster's waiting requests, cancelled): each
    leaves an exception and its frames behind, cyclic garbage, and every collection their number triggers
    walked all the others still parked: most of the stop's time (docs/performance.md, "Parked render
    requests"). The process ends soon after; what the pause leaves uncollected is collected then, or never."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


async def serve_async(
    unit: Unit,
    service: Service,
    *,
    stop: asyncio.Event | None = None,
    drain_timeout: float | None = None,
    freeze_heap: bool = False,
) -> bool:
    """``run_service`` with SIGTERM/SIGINT handlers: the first sets ``stop``, the second kills.

    ``stop`` may also be set by the service itself (e.g. a tool that ends after N messages).
    Returns False when a second signal killed the process, True after a graceful stop.
    """
    stop = stop if stop is not None else asyncio.Event()
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    killed = False

    def on_signal(sig: signal.Signals) -> None:
        nonlocal killed
        # Act first, log second: whatever happens to the log line, the signal has taken effect.
        if not stop.is_set():
            stop.set()
            unit.log.info("stopping", signal=sig.name)
        elif not killed and main is not None:
            killed = True
            main.cancel()
            unit.log.warning("second signal: killing", signal=sig.name)

    for sig in SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await run_service(unit, service, stop=stop, drain_timeout=drain_timeout, freeze_heap=freeze_heap)
    except asyncio.CancelledError:
        if not killed:
            raise
    finally:
        for sig in SIGNALS:
            loop.remove_signal_handler(sig)
    return not killed


def serve(
    app: str,
    make_service: Callable[[Unit], Service],
    *,
    config: Config | None = None,
    drain_timeout: float | None = None,
    settings: ProgramSettings | None = None,
) -> None:
    """The whole life of a service process; returns after a graceful stop. ``settings``: the program's
    (qbroker.settings), for its logging, broker and drain timeout. Exits with the codes of every console
    script (qbroker.exit_codes): 3 and one line when no broker lets it in, 1 when killed by a second signal."""
    if settings is not None:
        settings.configure_logging()
        config = config if config is not None else settings.unit_config()
        drain_timeout = drain_timeout if drain_timeout is not None else settings.drain_timeout

    def build() -> tuple[Unit, Service]:
        unit = Unit(app, config=config)
        return unit, make_service(unit)  # registers endpoints: before start

    _serve_process(app, build, drain_timeout)


def serve_unit(unit: Unit, service: Service, *, drain_timeout: float | None = None) -> None:
    """``serve`` for a unit built elsewhere (a module's own ``Unit``, as ``qbroker serve module:unit`` runs)."""
    _serve_process(unit.app, lambda: (unit, service), drain_timeout)


def _serve_process(app: str, build: Callable[[], tuple[Unit, Service]], drain_timeout: float | None) -> None:
    configure_logging()  # nothing more when the program's settings configured it already
    drop_repeated_connect_errors()

    async def main() -> bool:
        unit, service = build()
        bind_process(app=unit.app, uuid=unit.uuid)  # the service's own lines and its libraries' name the unit too
        return await serve_async(unit, service, drain_timeout=drain_timeout, freeze_heap=True)

    try:
        graceful = run(main())
    except BrokerUnavailable as exc:  # one line saying why (refused login, vhost, DNS, TLS, ...), exit 3
        exit_fatal(f"{app}: {exc.message}", int(ExitCode.UNREACHABLE), error=type(exc).__name__)
    except QBrokerError as exc:
        exit_fatal(f"{app}: {exc}", int(ExitCode.ERROR), error=type(exc).__name__)
    if not graceful:
        raise SystemExit(int(ExitCode.ERROR))
