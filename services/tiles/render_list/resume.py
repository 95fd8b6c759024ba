"""The resume file: how far a render-list job got, so a stopped run continues where it stopped.

Positions are the area plan's (``area``): every position below ``next`` is settled (rendered, skipped or
failed), and ``settled_ahead`` lists the settled ones past it (at most a window's worth, since requests
finish out of order). A run with the same file starts at ``next`` and skips ``settled_ahead``; its counts
carry on from the file's. The file is written whole to a temporary file and renamed over the old one, so a
kill at any moment leaves the last complete state.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .area import AreaPlan

FORMAT = "toposm-render-list/1"
MAX_FAILURES_KEPT = 100
OUTCOMES = ("rendered", "skipped", "failed")


class ResumeError(ValueError):
    """A resume file that cannot be read, or that belongs to another area."""


@dataclass
class Progress:
    """Where a job is and what it has done so far, by zoom (what the resume file holds)."""

    bbox: list[float]
    zooms: list[int]
    total: int
    next: int = 0
    settled_ahead: list[int] = field(default_factory=list)
    by_zoom: dict[str, dict[str, int]] = field(default_factory=dict)
    failures: list[dict[str, str]] = field(default_factory=list)

    @classmethod
    def new(cls, plan: AreaPlan) -> Progress:
        return cls(
            bbox=plan.bbox.as_list(),
            zooms=[plan.zooms.min_zoom, plan.zooms.max_zoom],
            total=plan.count,
            by_zoom={str(z): dict.fromkeys(OUTCOMES, 0) for z in plan.per_zoom()},
        )

    @property
    def settled(self) -> int:
        return self.next + len(self.settled_ahead)

    @property
    def complete(self) -> bool:
        return self.next >= self.total

    def counts(self) -> dict[str, int]:
        return {outcome: sum(z[outcome] for z in self.by_zoom.values()) for outcome in OUTCOMES}

    def record(self, zoom: int, outcome: str, metatile: str, reason: str | None = None) -> None:
        self.by_zoom.setdefault(str(zoom), dict.fromkeys(OUTCOMES, 0))[outcome] += 1
        if outcome == "failed" and len(self.failures) < MAX_FAILURES_KEPT:
            self.failures.append({"metatile": metatile, "reason": reason or ""})

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self)}


def load(path: Path, plan: AreaPlan) -> Progress:
    """The progress in ``path`` (a new one if the file does not exist); ResumeError if it is unreadable or
    was written for another area."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return Progress.new(plan)
    except (OSError, ValueError) as exc:
        raise ResumeError(f"resume file {path}: cannot read it ({exc})") from None
    fresh = Progress.new(plan)
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ResumeError(f"resume file {path}: not a {FORMAT} file")
    if raw.get("bbox") != fresh.bbox or raw.get("zooms") != fresh.zooms or raw.get("total") != fresh.total:
        raise ResumeError(
            f"resume file {path} is for --bbox {_bbox_text(raw.get('bbox'))} --zooms "
            f"{_zooms_text(raw.get('zooms'))}; give the same area, or another file"
        )
    try:
        progress = Progress(
            bbox=fresh.bbox,
            zooms=fresh.zooms,
            total=fresh.total,
            next=int(raw["next"]),
            settled_ahead=sorted(int(p) for p in raw.get("settled_ahead", [])),
            by_zoom={str(z): {o: int(c.get(o, 0)) for o in OUTCOMES} for z, c in dict(raw.get("by_zoom", {})).items()},
            failures=[
                {"metatile": str(f["metatile"]), "reason": str(f.get("reason", ""))} for f in raw.get("failures", [])
            ][:MAX_FAILURES_KEPT],
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ResumeError(f"resume file {path}: malformed ({exc})") from None
    if not 0 <= progress.next <= progress.total or any(
        p < progress.next or p >= progress.total for p in progress.settled_ahead
    ):
        raise ResumeError(f"resume file {path}: positions outside the area's {progress.total} metatiles")
    return progress


def save(path: Path, progress: Progress) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(progress.to_json(), out, indent=1)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _bbox_text(value: Any) -> str:
    return ",".join(str(v) for v in value) if isinstance(value, list) else "?"


def _zooms_text(value: Any) -> str:
    return f"{value[0]}-{value[1]}" if isinstance(value, list) and len(value) == 2 else "?"
