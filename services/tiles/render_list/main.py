"""``toposm-render-list``: pre-render every metatile of an area at bulk priority (broker from QBROKER_URL).

renderd's render_list and Tirex's tirex-batch for the TopOSM queuemaster: each metatile of the box at each
zoom is asked for as a ``bulk`` request, a window of them at a time, below every on-demand request and
expiry (the queuemaster's ``--max-bulk-threads`` caps the render threads it takes). Ctrl-C or SIGTERM stops
it within --drain-timeout, withdrawing what it queued; with --resume FILE a later run continues where it
stopped. Exit status (docs/cli.md): 0 done, 1 done with failed renders, 2 the queuemaster refused the job,
3 no broker reachable, or stopped before the end (resumable), 64 usage.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import model_validator

from qbroker import BrokerUnavailable, QBrokerError, Unit
from qbroker.exit_codes import ExitCode
from qbroker.printable import printable
from qbroker.runner import run, serve_async
from qbroker.settings import LogLevel, option, shared
from services.toposm.contract import Command
from services.toposm.seed_wire import AllProgramsTopic
from services.toposm.settings import StackSettings

from .area import AreaPlan, BBox, parse_zooms
from .job import JobSettings, RenderListJob
from .progress import ProgressView
from .resume import Progress, ResumeError, load, save

APP = "toposm.render_list"
SAVE_EVERY = 1.0  # seconds between writes of the resume file while running
EXIT_DONE, EXIT_FAILURES, EXIT_STOPPED, EXIT_REFUSED = ExitCode.OK, ExitCode.ERROR, ExitCode.UNREACHABLE, ExitCode.FAIL


class RenderListSettings(StackSettings):
    prog = "toposm-render-list"
    description = __doc__.split("\n\n")[0]
    epilog = __doc__.split("\n\n", 1)[1]

    bbox: str = option(help="the area, in degrees (WGS84 lon/lat)", metavar="W,S,E,N")
    zooms: str = option(help="zoom levels, e.g. 10-16 (or one: 14)", metavar="ZMIN-ZMAX")
    missing_only: bool = option(False, "render only metatiles never rendered before (off: every metatile of the area)")
    priority: Literal["bulk", "background"] = option(
        "bulk", "bulk: below everything else; background: like expired tiles"
    )
    window: int = option(32, "requests in flight at once (more than the render threads that may pre-render)", ge=1)
    resume: Path | None = option(
        None, "keep progress in FILE; a run with the same FILE and area continues where it stopped", metavar="FILE"
    )
    request_timeout: float = option(
        600.0, "seconds one request waits; a metatile still queued then is asked for again", gt=0
    )
    json_report: bool = option(False, "print the report as JSON on stdout", flag="--json")
    dry_run: bool = option(False, "count the metatiles per zoom and exit (no broker)")
    # The progress bar is the output: the library's lines only from warnings up.
    log_level: LogLevel = shared(StackSettings, "log_level", "WARNING")

    @model_validator(mode="after")
    def _area(self) -> RenderListSettings:
        AreaPlan(BBox.parse(self.bbox), parse_zooms(self.zooms))  # AreaError: a ValueError naming the mistake
        return self


@dataclass(frozen=True)
class Options:
    plan: AreaPlan
    job: JobSettings
    resume: Path | None
    json: bool
    dry_run: bool
    settings: RenderListSettings


def parse_args(argv: list[str] | None = None) -> Options:
    a = RenderListSettings.parse(argv)
    return Options(
        AreaPlan(BBox.parse(a.bbox), parse_zooms(a.zooms)),
        JobSettings(
            missing_only=a.missing_only,
            priority=a.priority,
            window=a.window,
            request_timeout=a.request_timeout,
            drain_timeout=a.drain_timeout,
        ),
        a.resume,
        a.json_report,
        a.dry_run,
        a,
    )


class RenderListService:
    """The job on a unit, in the runner's shape: it ends the process (``done``) when the job ends. It listens
    on ``toposm``, as every running program does (docs/tiles.md): a queuemaster (back) online there has the
    requests that wait for one ask again at once."""

    def __init__(self, unit: Unit, options: Options, progress: Progress, done: asyncio.Event) -> None:
        self.options = options
        self.job = RenderListJob(unit, options.plan, progress, options.job, changed=self._changed)
        self.all_programs = AllProgramsTopic(unit, self._program_command)
        self.view = ProgressView(self.job)
        self.done = done
        self._task: asyncio.Task[None] | None = None
        self._saved = 0.0

    async def start(self) -> None:
        self.view.start()
        self._task = asyncio.create_task(self.job.run())
        self._task.add_done_callback(lambda _: self.done.set())

    async def stop(self) -> None:
        await self.job.stop()
        if self._task is not None:
            await asyncio.wait({self._task})
        self.view.close()
        self._save()

    async def _program_command(self, body: dict[str, Any]) -> None:
        if body["command"] == Command.QUEUEMASTER_ONLINE:
            self.job.queuemaster_online()

    def _changed(self) -> None:
        self.view.update()
        if time.monotonic() - self._saved >= SAVE_EVERY:
            self._save()

    def _save(self) -> None:
        self._saved = time.monotonic()
        if self.options.resume is not None:
            try:
                save(self.options.resume, self.job.progress)
            except OSError as exc:
                self.job.waiting = f"cannot write {self.options.resume}: {exc}"


def report(options: Options, progress: Progress, seconds: float, fatal: str | None) -> dict[str, Any]:
    plan = options.plan
    per_zoom = plan.per_zoom()
    return {
        "bbox": plan.bbox.as_list(),
        "zooms": [plan.zooms.min_zoom, plan.zooms.max_zoom],
        "metatiles": plan.count,
        "settled": progress.settled,
        "remaining": plan.count - progress.settled,
        "complete": progress.complete,
        **progress.counts(),
        "by_zoom": {str(z): {"metatiles": n, **progress.by_zoom.get(str(z), {})} for z, n in per_zoom.items()},
        "failures": progress.failures[:20],
        "seconds": round(seconds, 3),
        "resume": str(options.resume) if options.resume else None,
        "refused": fatal,
    }


def _print_report(result: dict[str, Any]) -> None:
    state = "done" if result["complete"] else "stopped"
    lines = [
        f"toposm-render-list {state}: {result['settled']:,} of {result['metatiles']:,} metatiles in "
        f"{result['seconds']:.1f} s (rendered {result['rendered']:,}, skipped {result['skipped']:,}, "
        f"failed {result['failed']:,})"
    ]
    for zoom, row in result["by_zoom"].items():
        lines.append(
            f"  z{zoom}: {row['metatiles']:,} metatiles, rendered {row.get('rendered', 0):,}, "
            f"skipped {row.get('skipped', 0):,}, failed {row.get('failed', 0):,}"
        )
    lines += [f"  failed: {f['metatile']} {f['reason']}" for f in result["failures"][:5]]
    if result["refused"]:
        lines.append(f"  refused: {result['refused']}")
    elif not result["complete"]:
        lines.append(
            f"  run again with --resume {result['resume']} to continue"
            if result["resume"]
            else "  (no --resume FILE: a new run starts from the beginning)"
        )
    # Failure reasons and the refusal are the queuemaster's (and renderers') words: shown, never obeyed.
    print(printable("\n".join(lines), lines=True), file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    options = parse_args(argv)
    if options.dry_run:
        counts = options.plan.per_zoom()
        print(json.dumps({"metatiles": options.plan.count, "by_zoom": {str(z): n for z, n in counts.items()}}))
        return
    try:
        progress = load(options.resume, options.plan) if options.resume else Progress.new(options.plan)
    except ResumeError as exc:
        print(f"toposm-render-list: {exc}", file=sys.stderr)
        raise SystemExit(int(ExitCode.USAGE)) from None
    options.settings.configure_logging()
    started = time.monotonic()
    services: list[RenderListService] = []

    async def go() -> None:
        done = asyncio.Event()
        unit = Unit(APP, config=options.settings.unit_config())
        services.append(RenderListService(unit, options, progress, done))
        await serve_async(unit, services[0], stop=done, drain_timeout=1.0)

    if not progress.complete:
        try:
            run(go())
        except BrokerUnavailable as exc:  # one line, and the code of every console script for it
            print(f"toposm-render-list: {exc.message}", file=sys.stderr)
            raise SystemExit(int(ExitCode.UNREACHABLE)) from None
        except QBrokerError as exc:
            print(f"toposm-render-list: {exc}", file=sys.stderr)
            raise SystemExit(int(ExitCode.ERROR)) from None
    fatal = services[0].job.fatal if services else None
    result = report(options, progress, time.monotonic() - started, fatal)
    _print_report(result)
    if options.json:
        print(json.dumps(result))
    if fatal:
        raise SystemExit(int(EXIT_REFUSED))
    if not progress.complete:
        raise SystemExit(int(EXIT_STOPPED))
    raise SystemExit(int(EXIT_FAILURES if result["failed"] else EXIT_DONE))


if __name__ == "__main__":
    main()
