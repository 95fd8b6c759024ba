"""``toposm-web`` on a fresh vhost, with the real queuemaster and test-pattern renderers as
subprocesses (the tiles harness), and a real headless Chromium driven by Selenium."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.private_node import free_port
from harness.pytest_plugin import heavy
from tests.services.tiles.conftest import BIN, Proc, TileBus, bus, pytest_runtest_makereport  # noqa: F401 - fixtures reused

ARTIFACTS = Path(__file__).resolve().parents[3] / "var" / "test-artifacts" / "web"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,900",
)


# Every page the browser opens records what its Content-Security-Policy blocked (``csp_violations``); a script
# added through the DevTools protocol is not itself subject to the policy.
RECORD_CSP_VIOLATIONS = (
    "window.cspViolations = []; document.addEventListener('securitypolicyviolation', "
    "e => window.cspViolations.push(`${e.effectiveDirective} ${e.blockedURI}`));"
)


@dataclass
class Web:
    url: str
    proc: Proc


def start_web(tb: TileBus, *extra: str) -> Web:
    """``toposm-web`` as a subprocess, like an operator runs it."""
    port = free_port()
    args = [
        str(BIN / "toposm-web"),
        "--tile-root",
        str(tb.tile_root),
        "--render-log",
        str(tb.render_log),
        "--port",
        str(port),
        "--poll-interval",
        "0.3",
        *extra,
    ]
    proc = Proc(args, tb.url, tb.tmp / "web.log")
    tb.procs.append(proc)  # stopped by the bus fixture
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise AssertionError("toposm-web exited:\n" + proc.log.read_text())
        with contextlib.suppress(OSError):
            urllib.request.urlopen(url + "/api/status", timeout=2).read()  # noqa: S310 - our own server
            return Web(url, proc)
        time.sleep(0.2)
    raise AssertionError("toposm-web did not answer within 30s:\n" + proc.log.read_text())


@pytest.fixture
def web(bus: TileBus) -> Web:  # noqa: F811
    return start_web(bus, "--render-timeout", "20")


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture
@heavy("starts a headless Chromium")
def browser(tmp_path: Path) -> Iterator[object]:
    if not shutil.which("chromium") or not shutil.which("chromedriver"):
        pytest.fail("chromium and chromedriver are missing: run bin/ensure-chromium (bin/test does)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or ""
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console, for console_errors
    driver = webdriver.Chrome(options=options, service=Service(executable_path=shutil.which("chromedriver")))
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": RECORD_CSP_VIOLATIONS})
    try:
        yield driver
    finally:
        with contextlib.suppress(Exception):
            driver.quit()


async def csp_violations(browser: Any) -> list[str]:
    """What the page's Content-Security-Policy blocked since it was opened."""
    return list(await asyncio.to_thread(browser.execute_script, "return window.cspViolations"))


async def console_errors(browser: Any) -> list[str]:
    """What the browser's console logged as errors since the last call (a resource that failed to load, a
    script error): what a person opening the developer tools would see in red."""
    entries = await asyncio.to_thread(browser.get_log, "browser")
    return [entry["message"] for entry in entries if entry["level"] == "SEVERE"]


async def wait_for(browser: Any, script: str, timeout: float = 30.0) -> Any:
    """Wait for a DOM condition (a JS expression) without blocking the event loop."""
    from selenium.webdriver.support.ui import WebDriverWait

    def until() -> Any:
        return WebDriverWait(browser, timeout, poll_frequency=0.1).until(
            lambda driver: driver.execute_script(f"return {script}")
        )

    return await asyncio.to_thread(until)
