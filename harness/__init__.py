"""What the tests and the benchmarks share to run against real components, and nothing else imports.

- ``HANG``: the one ceiling that only catches hangs (tests wait on events, never on the clock); a wait that
  is slow by nature says so as a multiple of it.
- ``eventually``: the suite's wait, ``qbroker.testing.eventually`` with ``HANG`` as its ceiling.
- ``harness.broker``: a RabbitMQ vhost of its own per run, deleted afterwards.
- ``harness.osm``: the real extract read independently of the stores, and the one osmChange writer.
- ``harness.private_node``: a private RabbitMQ node (never the user's broker), for tests that stop it;
  ``harness.rabbitmq_cluster``: three of them clustered (tests/qbroker/core/test_cluster.py,
  bench/rabbitmq_cluster.py).
- ``harness.tcp_relay``: a relay between clients and a broker that holds back what the broker sends, then
  resets the connections: a publisher confirm lost with its node
  (tests/qbroker/core/test_guaranteed_delivery.py).
- ``harness.pytest_plugin`` (the ``heavy`` marker, by fixture) and ``harness.provisioned`` (a deployment made
  by ``qbroker provision``): pytest plugins that tests/conftest.py loads for both test trees.

bench/ imports this package, never tests/ (the benchmarks run without the test suite's fixtures).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from qbroker import QBrokerError
from qbroker.testing import eventually as _eventually

HANG = 60.0


async def eventually(
    predicate: Callable[[], Any],
    timeout: float = HANG,
    interval: float = 0.05,
    *,
    ignore: tuple[type[BaseException], ...] = (QBrokerError,),
    context: Callable[[], object] | None = None,
) -> Any:
    """Wait until ``predicate()`` (a function or coroutine function) returns something true, and return it;
    a QBrokerError (a service not up yet) counts as not yet. Fails the test after ``timeout``, with what
    ``context()`` says then (a service's log tail, what is still missing)."""
    try:
        return await _eventually(predicate, timeout, interval, ignore=ignore)
    except AssertionError as exc:
        if context is None:
            raise
        raise AssertionError(f"{exc}\n{context()}") from None
