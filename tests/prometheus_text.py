"""Reading a service's ``--metrics-port``: the Prometheus text and one sample's value."""

from __future__ import annotations

import re
import urllib.request


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:  # noqa: S310
        return str(response.read().decode())


def value(text: str, sample: str) -> float:
    """The value of ``sample`` (name and labels exactly as exposed), -1 when it is not there."""
    found = re.search(rf"^{re.escape(sample)} ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else -1.0
