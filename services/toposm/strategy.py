"""Render strategies: which queue a renderer thread takes its next metatile from.

A thread's strategy is one name or a weighted mix, ``missing:2,by_work_available:6``. For each pick the
queuemaster draws one strategy of the mix by weight (seeded RNG, so runs are reproducible) and asks it
for an ordered list of sources; the first non-empty source wins. If the drawn strategy finds nothing,
the other strategies of the mix are tried, so an idle thread never waits while its mix allows work.

Every strategy takes ``missing`` first, then ``important`` where it allows:

* ``missing``: only requested, never-rendered metatiles.
* ``important``: missing, then important.
* ``by_work_available``: missing, important, then a zoom drawn with weight = its queue length, then bulk.
* ``by_zoom``: missing, important, then a zoom drawn with weight = tiles at that zoom (4^z), so high
  zooms are favoured even when few of their metatiles are left, then bulk.

``bulk`` (``toposm-render-list``'s pre-rendering) comes last for every strategy that takes background work:
it renders only when nothing requested or expired is waiting for the thread (renderd's bulk queue).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

StrategyName = Literal["missing", "important", "by_work_available", "by_zoom"]
STRATEGY_NAMES: tuple[StrategyName, ...] = ("missing", "important", "by_work_available", "by_zoom")

MISSING = "missing"
IMPORTANT = "important"
BULK = "bulk"


class StrategyError(ValueError):
    """A strategy string that cannot be parsed."""


@dataclass(frozen=True, slots=True)
class StrategyMix:
    """A parsed strategy: names with positive integer weights, in the order given."""

    parts: tuple[tuple[StrategyName, int], ...]

    def __str__(self) -> str:
        if len(self.parts) == 1 and self.parts[0][1] == 1:
            return self.parts[0][0]
        return ",".join(f"{name}:{weight}" for name, weight in self.parts)

    def draw_order(self, rng: random.Random) -> list[StrategyName]:
        """The strategies to try for one pick: one drawn by weight, then the rest by weight too."""
        remaining = list(self.parts)
        order: list[StrategyName] = []
        while remaining:
            names = [n for n, _ in remaining]
            weights = [w for _, w in remaining]
            chosen = rng.choices(range(len(names)), weights=weights)[0] if len(names) > 1 else 0
            order.append(names[chosen])
            del remaining[chosen]
        return order


def parse_strategy(text: str) -> StrategyMix:
    """Parse ``name`` or ``name:weight,name:weight``; raise StrategyError naming the problem."""
    if not isinstance(text, str) or not text.strip():
        raise StrategyError("strategy must be a non-empty string")
    parts: dict[str, int] = {}
    for item in text.split(","):
        name, sep, weight_text = item.strip().partition(":")
        name = name.strip()
        if name not in STRATEGY_NAMES:
            raise StrategyError(f"unknown strategy {name!r}; expected one of {', '.join(STRATEGY_NAMES)}")
        weight = 1
        if sep:
            weight_text = weight_text.strip()
            if not (weight_text.isascii() and weight_text.isdigit()) or int(weight_text) == 0:
                raise StrategyError(f"strategy weight {weight_text!r} for {name} must be a positive integer")
            weight = int(weight_text)
        if name in parts:
            raise StrategyError(f"strategy {name} appears twice")
        parts[name] = weight
    return StrategyMix(tuple((n, w) for n, w in parts.items()))  # type: ignore[misc]


def choose_source(
    strategy: StrategyName,
    missing: int,
    important: int,
    by_zoom_queue: Mapping[int, int],
    rng: random.Random,
    bulk: int = 0,
) -> str | int | None:
    """The source one strategy picks given queue lengths: MISSING, IMPORTANT, a zoom, BULK, or None."""
    if missing:
        return MISSING
    if strategy == "missing":
        return None
    if important:
        return IMPORTANT
    if strategy == "important":
        return None
    zooms = [z for z, n in by_zoom_queue.items() if n > 0]
    if not zooms:
        return BULK if bulk > 0 else None
    if len(zooms) == 1:
        return zooms[0]
    weights: Sequence[float]
    if strategy == "by_work_available":
        weights = [by_zoom_queue[z] for z in zooms]
    else:  # by_zoom
        weights = [float(4**z) for z in zooms]
    return rng.choices(zooms, weights=weights)[0]


def choose_for_mix(
    mix: StrategyMix, missing: int, important: int, by_zoom_queue: Mapping[int, int], rng: random.Random, bulk: int = 0
) -> str | int | None:
    """The source a thread with this mix takes from, or None if nothing it may render is queued."""
    for name in mix.draw_order(rng):
        source = choose_source(name, missing, important, by_zoom_queue, rng, bulk)
        if source is not None:
            return source
    return None
