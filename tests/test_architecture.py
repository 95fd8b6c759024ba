"""House rules the test command checks: the import contracts in .importlinter (qbroker's layers, no circles,
no test double in production), mypy over the library and the services, and ruff."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_are_kept() -> None:
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert lint_imports is not None, "lint-imports not installed: bin/bootstrap (pip install --group test)"
    result = subprocess.run([lint_imports, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    assert found is not None, f"{name} not installed: bin/bootstrap (pip install --group test)"
    return found


def test_library_and_services_type_check() -> None:
    result = subprocess.run(
        [_tool("mypy"), "qbroker", "services"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]


def test_code_is_lint_clean() -> None:
    result = subprocess.run(
        [_tool("ruff"), "check", "qbroker", "services", "tests", "demo", "bench", "harness"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]


def test_toposm_contract_is_a_leaf() -> None:
    """services.toposm.contract (the TopOSM names, expiry list, metatile size and keys) imports nothing of the
    project, so every service and benchmark can import it without pulling in another's code."""
    probe = (
        "import sys, services.toposm.contract; "
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in ('services', 'qbroker'))))"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["services", "services.toposm", "services.toposm.contract"]
