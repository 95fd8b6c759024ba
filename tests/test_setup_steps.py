"""The set-up scripts' quiet mode (bin/lib/steps.sh): one line per step, the step's output only when it fails.

pip on this machine warns about its configured /opt/pypi* locations on every call; a newcomer must not see that
(or any installer chatter) unless the step fails, and then must see all of it."""

from __future__ import annotations

import subprocess
from pathlib import Path

STEPS = Path(__file__).resolve().parents[1] / "bin" / "lib" / "steps.sh"
NOISY = "echo 'WARNING: Location file:///opt/pypi/simple is ignored'; echo Collecting something; echo >&2 hint"


def steps(script: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail; source {STEPS}; {script}"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "QBROKER_SETUP_LOGS": str(tmp_path), **env},
        stdin=subprocess.DEVNULL,
    )


def test_a_step_that_works_is_one_line(tmp_path: Path) -> None:
    done = steps(f'run_step "installing things" bash -c "{NOISY}"; echo answer', tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "answer\n"  # a script's stdout stays its own (bin/ensure-osm-data prints a dir)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("installing things ") and " done (" in lines[0], lines
    assert "/opt/pypi" in (tmp_path / "installing-things.log").read_text()  # kept, not shown


def test_a_step_that_fails_shows_everything_and_stops_the_script(tmp_path: Path) -> None:
    failed = steps(f'run_step "installing things" bash -c "{NOISY}; exit 7"; echo not reached', tmp_path)
    assert failed.returncode == 7
    assert "not reached" not in failed.stdout
    for text in (
        "installing things",
        "FAILED (exit status 7)",
        "/opt/pypi",
        "Collecting something",
        "hint",
        str(tmp_path / "installing-things.log"),
    ):
        assert text in failed.stderr, text


def test_verbose_shows_everything_as_it_comes(tmp_path: Path) -> None:
    done = steps(f'run_step "installing things" bash -c "{NOISY}"', tmp_path, QBROKER_VERBOSE="1")
    assert done.returncode == 0 and "Collecting something" in done.stdout and "hint" in done.stderr
