"""Transports by URL scheme: aio-pika for amqp(s), memory only once qbroker.testing registered it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import qbroker.testing  # noqa: F401  (registers memory://, as any test that uses it does)
from qbroker import Config, Unit
from qbroker.transport import UnknownTransport, registered_schemes, transport_for


def test_schemes_registered() -> None:
    assert registered_schemes() == ["amqp", "amqps", "memory"]
    assert transport_for("amqp://guest@host/") is transport_for("AMQPS://guest@host/")


def test_unknown_scheme_names_the_registered_ones() -> None:
    with pytest.raises(UnknownTransport, match=r"'nats'.*registered: amqp, amqps, memory"):
        Unit("test.unit", config=Config(url="nats://127.0.0.1:4222"))


def test_production_code_does_not_load_the_test_double() -> None:
    """A process that never imports qbroker.testing has no memory transport, and says how to get one."""
    script = textwrap.dedent("""
        import sys
        import qbroker.cli.dead_letter, qbroker.cli.debug, qbroker.cli.main, qbroker.runner, qbroker.unit
        from qbroker import Config, Unit
        assert "qbroker.testing" not in sys.modules, "a production module imported qbroker.testing"
        try:
            Unit("x", config=Config(url="memory://x"))
        except ValueError as exc:
            print(exc)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "import qbroker.testing" in result.stdout
    assert "registered: amqp, amqps" in result.stdout
