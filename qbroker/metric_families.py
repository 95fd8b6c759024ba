"""The metric families qbroker.metrics keeps for Prometheus: plain numbers changed on the event loop without a
lock and turned into prometheus-client families at scrape time, and the cap on the names that label them."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

OTHER = "other"  # the label of whatever is past a cap, or not defined by this program


class NameLabels:
    """A name's label: ``label(name)`` (the name itself by default); the first ``cap`` distinct labels as
    themselves, every later one as ``other``. ``known`` remembers the labels of up to ``4 * cap`` names (the
    hot path reads it); a name past those is labelled afresh each time, so an endless stream of new names
    (a per-process endpoint of a renderer restarted every day) costs no memory and keeps its label."""

    def __init__(self, cap: int, label: Callable[[str], str] | None = None) -> None:
        self.cap = cap
        self.label = label
        self.known: dict[str, str] = {}
        self.labels: set[str] = set()

    def __call__(self, name: str) -> str:
        found = self.known.get(name)
        if found is not None:
            return found
        label = name if self.label is None else self.label(name)
        if label not in self.labels:
            if len(self.labels) >= self.cap:
                label = OTHER
            else:
                self.labels.add(label)
        if len(self.known) < 4 * self.cap:
            self.known[name] = label
        return label


class Counts:
    """A counter (``gauge``: a gauge) family's values by label values. Plain numbers, changed on the event loop
    without a lock (prometheus-client's own metrics take one per update, most of what metrics would cost a
    request: docs/decisions.md, "The operator's view"); read by ``family`` at scrape time from a copy (one C-level call,
    atomic under the GIL), so the HTTP thread never sees a value half written."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str], kind: str = "counter") -> None:
        self.name, self.documentation, self.labels, self.kind = name, documentation, tuple(labels), kind
        self.values: dict[tuple[str, ...], float] = {}

    def inc(self, key: tuple[str, ...], amount: float = 1.0) -> None:
        values = self.values
        values[key] = values.get(key, 0.0) + amount

    def family(self, empty: bool = False) -> Metric:
        cls = CounterMetricFamily if self.kind == "counter" else GaugeMetricFamily
        family = cls(self.name, self.documentation, labels=self.labels)
        for key, value in [] if empty else list(self.values.items()):
            family.add_metric(key, value)
        return family


class Timings:
    """A histogram family's values: per label values one list of bucket counts (not cumulative; the last is
    +Inf) followed by the sum, copied whole at scrape time, so count, buckets and sum agree."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str], bounds: Sequence[float]) -> None:
        self.name, self.documentation, self.labels = name, documentation, tuple(labels)
        self.bounds = tuple(bounds)
        self.le = [*(floatToGoString(b) for b in self.bounds), "+Inf"]
        self.values: dict[tuple[str, ...], list[float]] = {}

    def observe(self, key: tuple[str, ...], seconds: float) -> None:
        row = self.values.get(key)
        if row is None:
            row = self.values[key] = [0.0] * (len(self.bounds) + 2)
        row[bisect.bisect_left(self.bounds, seconds)] += 1  # the first bound >= seconds: le is inclusive
        row[-1] += seconds

    def family(self, empty: bool = False) -> Metric:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labels)
        for key, row in [] if empty else list(self.values.items()):
            counts = list(row)
            family.add_metric(key, list(zip(self.le, itertools.accumulate(counts[:-1]), strict=True)), counts[-1])
        return family
