"""The docs' code blocks that run offline are run, so a doc cannot show a command the code no longer takes.

Convention (docs/testing.md): an HTML comment on the line before a fenced block marks it runnable:

* ``<!-- runnable -->`` before a ``sh`` block: each line is a command, run with bash; it must exit 0;
* ``<!-- runnable: pytest -->`` before a ``python`` block: the block is a test module, run with pytest;
* ``<!-- runnable: import -->`` before a ``python`` block: the block is a module that must import cleanly
  (definitions, a service class: what it would start under ``__main__`` is not run).

The runnable blocks of one page run in page order in one working directory, as a reader would type them
(a store imported by one block is what the next one previews), with the repository's OSM extracts at
``var/osm`` as in a checkout. They run with ``QBROKER_URL`` pointing at a closed port: a command that
touched a broker would fail. Unmarked blocks (they need a broker, a database or minutes) are not run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.pytest_plugin import heavy

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"<!-- runnable(?:: (?P<how>[a-z]+))? -->\n```(?P<lang>[a-z]*)\n(?P<body>.*?)\n```", re.S)
OFFLINE_ENV = {
    **os.environ,
    "QBROKER_URL": "amqp://nobody:nothing@127.0.0.1:1/",
    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    "PYTHONPATH": str(ROOT),
}
Block = tuple[str, str, str]  # where (page:line), how (sh, pytest, import), body


def runnable_blocks() -> dict[str, list[Block]]:
    found: dict[str, list[Block]] = {}
    for doc in sorted((ROOT / "docs").glob("*.md")):
        text = doc.read_text(encoding="utf-8")
        for match in BLOCK.finditer(text):
            line = text[: match.start()].count("\n") + 1
            found.setdefault(doc.name, []).append((f"{doc.name}:{line}", match["how"] or match["lang"], match["body"]))
    return found


PAGES = runnable_blocks()


def test_the_docs_mark_runnable_blocks() -> None:
    kinds = {how for blocks in PAGES.values() for _, how, _ in blocks}
    assert kinds >= {"sh", "pytest", "import"}, PAGES


@pytest.fixture(scope="module")
@heavy("the docs' runnable blocks import the real OSM extracts")
def osm_extracts() -> Path:
    out = subprocess.run(
        [str(ROOT / "bin" / "ensure-osm-data")], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    assert out.returncode == 0, out.stderr
    return ROOT / out.stdout.strip()


@pytest.mark.parametrize("page", sorted(PAGES))
def test_runnable_doc_blocks(page: str, tmp_path: Path, osm_extracts: Path) -> None:
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "osm").symlink_to(osm_extracts)
    for where, how, body in PAGES[page]:
        run_block(where, how, body, tmp_path)


def run_block(where: str, how: str, body: str, cwd: Path) -> None:
    if how == "sh":
        for command in body.splitlines():
            command = command.split("  #")[0].strip()
            if not command or command.startswith("#"):
                continue
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=cwd,
                env=OFFLINE_ENV,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert done.returncode == 0, f"{where}: {command!r} exited {done.returncode}\n{done.stderr[-2000:]}"
    elif how == "pytest":
        module = cwd / "test_doc_block.py"
        module.write_text(body + "\n", encoding="utf-8")
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "asyncio_mode=auto", str(module)],
            cwd=cwd,
            env=OFFLINE_ENV,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        module.unlink()
        assert done.returncode == 0, f"{where}: pytest exited {done.returncode}\n{done.stdout[-3000:]}"
    elif how == "import":
        name = "doc_block_" + re.sub(r"\W", "_", where)  # one module per block: no stale bytecode
        (cwd / f"{name}.py").write_text(body + "\n", encoding="utf-8")
        done = subprocess.run(
            [sys.executable, "-c", f"import {name}"],
            cwd=cwd,
            env=OFFLINE_ENV,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"{where}: import exited {done.returncode}\n{done.stderr[-3000:]}"
    else:
        raise AssertionError(f"{where}: unknown runnable kind {how!r}")
