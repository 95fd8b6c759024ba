"""Reading a program's ``--metrics-port``: the Prometheus text, one sample's value, and what every program's
text must (its build info) and must not (``_created`` series, process ids in labels) hold (docs/metrics.md)."""

from __future__ import annotations

import re
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

import qbroker


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:  # noqa: S310
        return str(response.read().decode())


def value(text: str, sample: str) -> float:
    """The value of ``sample`` (name and labels exactly as exposed), -1 when it is not there."""
    found = re.search(rf"^{re.escape(sample)} ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else -1.0


def created_series(text: str) -> list[str]:
    return sorted(
        {s.name for f in text_string_to_metric_families(text) for s in f.samples if s.name.endswith("_created")}
    )


def labels_naming(text: str, *pids: int) -> list[str]:
    """The samples with a label value that has one of ``pids`` as a dot-separated word (``le`` and
    ``quantile`` are numbers of their own)."""
    words = {str(pid) for pid in pids}
    return [
        f"{s.name}{s.labels}"
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if any(words & set(v.split(".")) for k, v in s.labels.items() if k not in ("le", "quantile"))
    ]


def says_its_version(text: str, namespace: str, version: str = qbroker.__version__) -> bool:
    """``<namespace>_build_info{version="<the program's version>"} 1``, and no other build info."""
    infos = [line for line in text.splitlines() if re.match(r"[a-z_]+_build_info[{ ]", line)]
    return infos == [f'{namespace}_build_info{{version="{version}"}} 1.0']
