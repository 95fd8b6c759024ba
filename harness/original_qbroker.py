"""The original QBroker (trio_qbroker) as a peer on the bus: its environment, built once and cached.

The original lives outside this repository (``../shared/peers/trio_qbroker``, or ``QBROKER_ORIGINAL_DIR``:
where the harness finds the program it runs; what it puts on the wire is described in docs/interop.md)
and predates Python 3.11: it runs in a virtualenv of its own with the versions its README names, from the
package index, patched so trio 0.10's traceback hook accepts Python 3.11's keywords. The venv is built
once into ``.peer-venv`` (or ``QBROKER_PEER_VENV``) and reused while the package list and the patch are
unchanged. Tests skip only when the package index cannot be reached (``IndexUnreachable``).

    .venv/bin/python -m harness.original_qbroker     # build (or check) the venv, print its python
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The versions the original is known to work with on Python 3.11 (as its own README names them).
PEER_PACKAGES = ("trio==0.10.0", "trio-amqp==0.2.13", "pytz", "PyYAML", "pytest==7.4.4", "pytest-trio==0.5.1")
PATCH_NAME = "trio-py311.patch"
READY = ".qbroker-peer-ready"  # holds the hash of what the venv was built from
DEFAULT_INDEX = "https://pypi.org/simple/"


class IndexUnreachable(RuntimeError):
    """The package index the original's environment comes from cannot be reached: tests skip."""


class PeerSetupError(RuntimeError):
    """The original's source is missing or its environment could not be built (not a network problem)."""


def original_source() -> Path:
    return Path(os.environ.get("QBROKER_ORIGINAL_DIR") or ROOT.parent / "shared" / "peers" / "trio_qbroker")


def peer_venv_dir() -> Path:
    return Path(os.environ.get("QBROKER_PEER_VENV") or ROOT / ".peer-venv")


def _spec(source: Path) -> str:
    patch = (source / PATCH_NAME).read_bytes()
    text = "\n".join((*PEER_PACKAGES, f"python{sys.version_info.major}.{sys.version_info.minor}"))
    return hashlib.sha256(text.encode() + patch).hexdigest()


def _index_url() -> str:
    configured = os.environ.get("PIP_INDEX_URL")
    if configured:
        return configured
    done = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.index-url"], capture_output=True, text=True, timeout=60
    )
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else DEFAULT_INDEX


def check_index(timeout: float = 15.0) -> None:
    """Raise IndexUnreachable when the index does not answer for the first package's page."""
    url = _index_url().rstrip("/") + "/trio/"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:  # noqa: S310 (the configured index)
            answer.read(1)
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        raise IndexUnreachable(
            f"the package index {url} is unreachable ({exc}); the original QBroker's environment cannot be built"
        ) from exc


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time (pytest-xdist workers, parallel runs)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ensure_peer_python() -> Path:
    """The python of the original's venv, built now if missing or stale. Raises IndexUnreachable or
    PeerSetupError."""
    source = original_source()
    if not (source / "trio_qbroker" / "__init__.py").is_file():
        raise PeerSetupError(f"the original QBroker is not at {source} (set QBROKER_ORIGINAL_DIR)")
    venv = peer_venv_dir()
    spec = _spec(source)
    python = venv / "bin" / "python"
    ready = venv / READY
    with _locked(venv.with_name(venv.name + ".lock")):
        if ready.is_file() and ready.read_text().strip() == spec and python.exists():
            return python
        check_index()
        building = venv.with_name(f"{venv.name}.building-{os.getpid()}")
        shutil.rmtree(building, ignore_errors=True)
        try:
            _build(building, source)
            (building / READY).write_text(spec + "\n")
            shutil.rmtree(venv, ignore_errors=True)
            building.rename(venv)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return python


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise PeerSetupError(f"{what} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def _build(venv: Path, source: Path) -> None:
    _run([sys.executable, "-m", "venv", str(venv)], "creating the original's venv")
    python = str(venv / "bin" / "python")
    _run([python, "-m", "pip", "install", "--quiet", *PEER_PACKAGES], "installing the original's packages")
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    with open(source / PATCH_NAME, "rb") as patch:
        done = subprocess.run(["patch", "-p0", "-d", str(site)], stdin=patch, capture_output=True, timeout=60)
    if done.returncode != 0:
        raise PeerSetupError(f"patching trio failed: {done.stdout.decode()} {done.stderr.decode()}")


if __name__ == "__main__":
    print(ensure_peer_python())
