"""The version a program reports (``<program>_build_info``, docs/metrics.md): its installed distribution's.

One function, so that a program names its distribution once: the library and the TopOSM services are one
distribution today (``qbroker``); a program installed from another passes that one's name.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "qbroker"
UNKNOWN = "unknown"  # run from a source tree that was never installed: no metadata to read


def installed_version(distribution: str = DISTRIBUTION) -> str:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return UNKNOWN
