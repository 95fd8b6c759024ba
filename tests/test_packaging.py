"""Both distributions built from this checkout and installed as a user would, in clean venvs.

The two wheels (``qbroker-amqp``, the library; ``toposm-stack``, from services/) are built without build
isolation (setuptools comes from the test group). The library is installed exactly as docs/tutorial.md's
install step says, with the built wheels as ``--find-links`` and every dependency from the package index, and
the tutorial's code runs on it; the stack is installed with ``[web]``. Heavy: it makes venvs and downloads
the dependencies.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import qbroker
from harness import HANG
from services import toposm
from tests.test_tutorial import install_commands, run_tutorial

pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parents[1]
INSTALL_HANG = 20 * HANG  # a venv and its dependencies from the index, on a loaded machine
LIBRARY_SCRIPTS = ("qbroker", "qbroker-debug", "qbroker-dead-letter")
STACK_SCRIPTS = (
    "toposm-queuemaster",
    "toposm-renderer",
    "toposm-render-list",
    "qbroker-spark-bridge",
    "toposm-web",
    "toposm-import",
    "toposm-replicate",
)


def _clean_env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith("QBROKER_")
    }


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("packaging")
    source = work / "src"  # a copy: building writes build/ and *.egg-info next to the sources
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for package in ("qbroker", "services"):
        shutil.copytree(ROOT / package, source / package, ignore=ignore)  # services/LICENSE: the file itself
    out = work / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(source),
            str(source / "services"),
        ],
        check=True,
        timeout=INSTALL_HANG,
        env=_clean_env(),
    )
    return out


def _venv(path: Path, wheels: Path, *requirements: str) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=INSTALL_HANG)
    done = subprocess.run(
        [
            str(path / "bin" / "pip"),
            "install",
            "-q",
            "--disable-pip-version-check",
            "--find-links",
            str(wheels),
            *requirements,
        ],
        capture_output=True,
        text=True,
        timeout=INSTALL_HANG,
        env=_clean_env(),
        cwd=path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return path


@pytest.fixture(scope="module")
def library_venv(wheels: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The library installed as docs/tutorial.md says, word for word."""
    (command,) = install_commands()
    words = shlex.split(command)
    assert words[:2] == ["pip", "install"] and words[2].startswith("qbroker-amqp"), command
    return _venv(tmp_path_factory.mktemp("library") / "venv", wheels, *words[2:])


@pytest.fixture(scope="module")
def stack_venv(wheels: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _venv(tmp_path_factory.mktemp("stack") / "venv", wheels, "toposm-stack[web]")


def run(venv: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    # Never from the checkout: `python -c` puts the working directory first on sys.path.
    return subprocess.run(
        [str(venv / "bin" / args[0]), *args[1:]],
        capture_output=True,
        text=True,
        timeout=INSTALL_HANG,
        env=_clean_env(),
        cwd=cwd or venv,
    )


def _tops(wheel: Path) -> set[str]:
    return {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}


def test_each_wheel_holds_only_its_own_package(wheels: Path) -> None:
    (library,) = wheels.glob("qbroker_amqp-*.whl")
    (stack,) = wheels.glob("toposm_stack-*.whl")
    assert _tops(library) == {"qbroker", f"qbroker_amqp-{qbroker.__version__}.dist-info"}
    assert _tops(stack) == {"services", f"toposm_stack-{toposm.__version__}.dist-info"}
    names = set(zipfile.ZipFile(stack).namelist())
    # services is a namespace package (no __init__.py), and the explicit package list misses no module.
    assert "services/__init__.py" not in names
    tree = {str(p.relative_to(ROOT)) for p in (ROOT / "services").rglob("*.py") if "__pycache__" not in p.parts}
    assert tree - names == set()
    assert {"services/tiles/data/style.xml", "services/web/static/map.html"} <= names


def test_the_library_installs_as_the_tutorial_says(library_venv: Path) -> None:
    probe = run(
        library_venv,
        "python",
        "-c",
        """
import importlib.metadata as md, importlib.util, json, logging, pathlib
import structlog
import qbroker
from qbroker import Unit
unit = Unit("packaging.probe")  # builds without a broker
try:
    from qbroker.schedule import valid_cron
    valid_cron("* * * * *")
    cron = "works"
except ModuleNotFoundError as exc:
    cron = str(exc)
print(json.dumps({
    "file": qbroker.__file__, "version": qbroker.__version__, "dist": md.version("qbroker-amqp"),
    "typed": (pathlib.Path(qbroker.__file__).parent / "py.typed").is_file(),
    "license": md.metadata("qbroker-amqp")["License-Expression"],
    "services": importlib.util.find_spec("services") is not None,
    "configured": structlog.is_configured() or bool(logging.getLogger().handlers), "cron": cron,
}))
""",
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stderr == ""  # a library script prints nothing it did not ask for
    found = json.loads(probe.stdout)
    assert found["file"].startswith(str(library_venv))  # the wheel's copy, not the checkout's
    assert found["version"] == found["dist"] == qbroker.__version__
    assert found["typed"] is True and found["license"] == "MIT"
    assert found["services"] is False  # the library's venv has no `services` at all
    assert found["configured"] is False  # importing and making a unit configure no logging
    # croniter is the cron extra, which the tutorial's install leaves out: one line saying what to install
    assert found["cron"] == "cron schedules need croniter: pip install 'qbroker-amqp[cron]'"


def test_a_library_script_prints_only_what_it_asks_for(library_venv: Path, amqp_url: str, tmp_path: Path) -> None:
    """A unit started, called and stopped by a plain script: its output is its own print, nothing else
    (no `connected`, no `unit started`: logging is the application's to set up)."""
    (tmp_path / "quiet.py").write_text(
        "import asyncio\n"
        "from qbroker import Unit\n\n"
        "unit = Unit('packaging.quiet')\n\n\n"
        "@unit.rpc('packaging.quiet.echo')\n"
        "async def echo(text: str) -> str:\n"
        "    return text\n\n\n"
        "async def main() -> None:\n"
        "    async with unit:\n"
        "        print(await unit.call('packaging.quiet.echo', {'text': 'hello'}))\n\n\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run(
        [str(library_venv / "bin" / "python"), "quiet.py"],
        capture_output=True,
        text=True,
        timeout=INSTALL_HANG,
        env={**_clean_env(), "QBROKER_URL": amqp_url},
        cwd=tmp_path,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "hello\n", "")


def test_every_library_script_answers_help_and_version(library_venv: Path) -> None:
    for script in LIBRARY_SCRIPTS:
        helped = run(library_venv, script, "--help")
        assert helped.returncode == 0 and "usage" in helped.stdout.lower(), (script, helped.stderr)
        version = run(library_venv, script, "--version")
        assert (version.returncode, version.stdout) == (0, f"{script} {qbroker.__version__}\n"), version.stderr


def test_the_tutorial_runs_on_the_installed_library(library_venv: Path, amqp_url: str, tmp_path: Path) -> None:
    run_tutorial(tmp_path, amqp_url, library_venv / "bin")


def test_the_qbroker_command_without_its_extra_says_what_to_install(wheels: Path, tmp_path: Path) -> None:
    base = _venv(tmp_path / "venv", wheels, "qbroker-amqp")
    for script in ("qbroker", "qbroker-debug"):
        done = run(base, script, "--help")
        assert (done.returncode, done.stdout) == (64, "")
        assert done.stderr == f"{script}: this command needs the cli extra: pip install 'qbroker-amqp[cli]'\n"
    done = run(base, "qbroker-dead-letter", "--help")  # needs no extra
    assert done.returncode == 0 and "usage" in done.stdout


def test_the_stack_with_web_runs_toposm_web(stack_venv: Path) -> None:
    helped = run(stack_venv, "toposm-web", "--help")
    assert helped.returncode == 0 and helped.stdout.startswith("usage: toposm-web"), helped.stderr
    for script in STACK_SCRIPTS:
        version = run(stack_venv, script, "--version")
        assert (version.returncode, version.stdout) == (0, f"{script} {toposm.__version__}\n"), version.stderr


def test_a_stack_script_without_its_extra_prints_one_line(stack_venv: Path) -> None:
    for script, extra in (
        ("toposm-renderer", "render"),
        ("toposm-import", "import"),
        ("qbroker-spark-bridge", "spark"),
        ("toposm-replicate", "replicate"),
    ):
        done = run(stack_venv, script, "--help")
        assert (done.returncode, done.stdout) == (64, ""), (script, done.stderr)
        assert done.stderr == f"{script}: this command needs the {extra} extra: pip install 'toposm-stack[{extra}]'\n"
    done = run(stack_venv, "toposm-queuemaster", "--help")  # needs no extra
    assert done.returncode == 0 and "usage" in done.stdout
