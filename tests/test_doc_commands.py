"""The docs' code blocks that run offline are run, so a doc cannot show a command the code no longer takes.

Convention (docs/testing.md): an HTML comment on the line before a fenced block marks it runnable:

* ``<!-- runnable -->`` before a ``sh`` block: each line is a command, run with bash; it must exit 0;
* ``<!-- runnable: pytest -->`` before a ``python`` block: the block is a test module, run with pytest.

They run with ``QBROKER_URL`` pointing at a closed port: a command that touched a broker would fail.
Unmarked blocks (they need a broker, data or minutes) are not run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"<!-- runnable(?:: (?P<how>[a-z]+))? -->\n```(?P<lang>[a-z]*)\n(?P<body>.*?)\n```", re.S)
OFFLINE_ENV = {**os.environ, "QBROKER_URL": "amqp://nobody:nothing@127.0.0.1:1/",
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               "PYTHONPATH": str(ROOT)}


def runnable_blocks() -> list[tuple[str, str, str]]:
    found = []
    for doc in sorted((ROOT / "docs").glob("*.md")):
        for match in BLOCK.finditer(doc.read_text(encoding="utf-8")):
            line = doc.read_text(encoding="utf-8")[: match.start()].count("\n") + 1
            found.append((f"{doc.name}:{line}", match["how"] or match["lang"], match["body"]))
    return found


BLOCKS = runnable_blocks()


def test_the_docs_mark_runnable_blocks() -> None:
    assert {how for _, how, _ in BLOCKS} >= {"sh", "pytest"}, BLOCKS


@pytest.mark.parametrize(("where", "how", "body"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_runnable_doc_block(where: str, how: str, body: str, tmp_path: Path) -> None:
    if how == "sh":
        for command in body.splitlines():
            command = command.split("  #")[0].strip()
            if not command or command.startswith("#"):
                continue
            done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=OFFLINE_ENV, capture_output=True,
                                  text=True, timeout=120, check=False)
            assert done.returncode == 0, f"{where}: {command!r} exited {done.returncode}\n{done.stderr[-2000:]}"
    elif how == "pytest":
        module = tmp_path / "test_doc_block.py"
        module.write_text(body + "\n", encoding="utf-8")
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o",
                               "asyncio_mode=auto", str(module)], cwd=tmp_path, env=OFFLINE_ENV,
                              capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, f"{where}: pytest exited {done.returncode}\n{done.stdout[-3000:]}"
    else:
        raise AssertionError(f"{where}: unknown runnable kind {how!r}")
