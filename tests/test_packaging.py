"""``pip install qbroker`` from this checkout: the library and its CLI work without any extra.

The test builds the wheel (no build isolation: setuptools comes from the test extra) into a fresh venv
with ``--no-deps``. The base dependencies are taken from the shared venv's site-packages (appended to the
fresh venv's path, whose own copy of qbroker comes first), and every extra's top-level module is made
unimportable there, as on a machine where only ``pip install qbroker`` ran. Nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from harness import HANG

ROOT = Path(__file__).resolve().parents[1]
BUILD_HANG = 5 * HANG  # a wheel build on a loaded machine
# Top-level modules that only the extras (tiles, spark, web, otel, bench, test) install.
EXTRAS_ONLY = ("PIL", "mapnik", "osmium", "pyarrow", "pyspark", "matplotlib", "aiohttp", "prometheus_client",
               "opentelemetry", "faststream", "selenium", "pytest", "hypothesis", "mercantile")
BLOCKER = f'''
import importlib.abc, sys

class _OnlyBaseInstall(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {EXTRAS_ONLY!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (an extra, not installed)", name=name)
        return None

sys.meta_path.insert(0, _OnlyBaseInstall())
'''


@pytest.fixture(scope="module")
def base_install(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("packaging")
    source = work / "src"  # a copy: building writes build/ and *.egg-info next to the sources
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("qbroker", "services"):
        shutil.copytree(ROOT / package, source / package, ignore=ignore)
    wheels = work / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(source)], check=True, timeout=BUILD_HANG, env=_clean_env())
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=BUILD_HANG)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    *map(str, wheels.glob("qbroker-*.whl"))], check=True, timeout=BUILD_HANG, env=_clean_env())
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "_only_base_install.py").write_text(BLOCKER)
    shared = sysconfig.get_paths()["purelib"]
    (site / "zz_shared_base_dependencies.pth").write_text(f"import _only_base_install\n{shared}\n")
    return venv


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME") and
            not k.startswith("QBROKER_")}


def run(venv: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    # Never from the checkout: `python -c` puts the working directory first on sys.path.
    return subprocess.run([str(venv / "bin" / args[0]), *args[1:]], capture_output=True, text=True,
                          timeout=BUILD_HANG, env=_clean_env(), cwd=cwd or venv)


def test_the_base_install_imports_the_library_and_not_the_extras(base_install: Path) -> None:
    probe = run(base_install, "python", "-c", """
import importlib, importlib.metadata as md, json, pathlib
import qbroker
from qbroker import Unit, Config, RequestContext
import qbroker.unit, qbroker.cli.main, qbroker.asyncapi, qbroker.middleware, qbroker.testing
unit = Unit("packaging.probe")  # builds without a broker or any extra
try:
    importlib.import_module("qbroker.tracing")
    tracing = "imported"
except ModuleNotFoundError as exc:
    tracing = exc.name if "qbroker[otel]" in str(exc) else repr(exc)
meta = md.metadata("qbroker")
print(json.dumps({
    "file": qbroker.__file__, "typed": (pathlib.Path(qbroker.__file__).parent / "py.typed").is_file(),
    "version": meta["Version"], "license": meta["License-Expression"],
    "base": [r for r in md.requires("qbroker") if "extra ==" not in r], "tracing": tracing,
}))
""")
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    assert found["file"].startswith(str(base_install))  # the wheel's copy, not the checkout's
    assert found["typed"] is True
    assert found["license"] == "MIT" and found["version"].count(".") == 2
    heavy = ("pillow", "mapnik", "osmium", "pyarrow", "pyspark", "matplotlib", "aiohttp", "prometheus",
             "opentelemetry")
    assert not [r for r in found["base"] if r.lower().startswith(heavy)], found["base"]
    assert found["tracing"] == "opentelemetry"  # the otel extra is what brings it


def test_the_cli_works_from_the_base_install(base_install: Path, tmp_path: Path) -> None:
    helped = run(base_install, "qbroker", "--help")
    assert helped.returncode == 0 and "asyncapi" in helped.stdout, helped.stderr
    (tmp_path / "shop.py").write_text(
        "from qbroker import Unit\n\n"
        "def make_service(unit: Unit) -> None:\n"
        "    @unit.rpc('shop.price')\n"
        "    async def price(item: str) -> float:\n"
        "        return 1.0\n")
    described = run(base_install, "qbroker", "asyncapi", "shop:make_service", cwd=tmp_path)
    assert described.returncode == 0, described.stderr
    assert json.loads(described.stdout)["channels"]["rpc.shop.price"]["address"] == "shop.price"
