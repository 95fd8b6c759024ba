"""Where replication diffs come from: a local directory or a replication server over HTTP(S).

Both are laid out as planet.openstreetmap.org/replication/minute/ is (``services.osmstore.replication``).
Over HTTP the URLs, the kept-alive session and its retry policy are pyosmium's
(``osmium.replication.server.ReplicationServer``, what ``pyosmium-get-changes`` and
``osm2pgsql-replication`` use); the bodies are read here with a size cap, and the failures sorted into
the three kinds the follower treats differently:

- ``DiffMissing``: the server answered 404/410 (or the file is not there): a gap, permanent;
- ``SourceUnavailable``: the server is down, slow, answers 5xx, or cut a download short: try again later;
- ``ReplicationError``: anything else wrong with what was read (a malformed state file).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import requests
from osmium.replication.server import ReplicationServer
from urllib3.util import Retry

from services.osmstore.replication import (
    STATE_BYTES,
    ReplicationError,
    ReplicationState,
    diff_path,
    parse_state,
    read_state,
    state_path,
)

MAX_DIFF_BYTES = 256 * 1024 * 1024  # a minutely diff is a few MB, a daily one ~100 MB: more is not a diff
_GONE = (404, 410)
_RETRY_STATUS = (408, 429, 500, 502, 503, 504)


class SourceUnavailable(Exception):
    """The source did not answer (or cut the answer short): worth trying again later."""


class DiffMissing(Exception):
    """A file the source should have is not there (a gap)."""

    def __init__(self, where: str) -> None:
        super().__init__(f"{where} is missing")
        self.where = where


class ReplicationSource(Protocol):
    def latest(self) -> ReplicationState: ...  # state.txt: the newest sequence published

    def state(self, sequence: int) -> ReplicationState: ...  # 000/000/001.state.txt

    def diff(self, sequence: int) -> bytes: ...  # 000/000/001.osc.gz, as published

    def where(self, sequence: int) -> str: ...  # the diff's path or URL, for messages

    def close(self) -> None: ...


def is_url(source: str | Path) -> bool:
    return isinstance(source, str) and source.startswith(("http://", "https://"))


def open_source(source: str | Path, *, timeout: float = 60.0, retries: int = 3) -> ReplicationSource:
    if is_url(source):
        return HttpSource(str(source), timeout=timeout, retries=retries)
    return LocalSource(Path(source))


class LocalSource:
    def __init__(self, root: Path) -> None:
        self.root = root

    def latest(self) -> ReplicationState:
        return read_state(self.root / "state.txt")

    def state(self, sequence: int) -> ReplicationState:
        path = state_path(self.root, sequence)
        if not path.is_file():
            raise DiffMissing(str(path))
        return read_state(path)

    def diff(self, sequence: int) -> bytes:
        path = diff_path(self.root, sequence)
        try:
            with path.open("rb") as fh:
                data = fh.read(MAX_DIFF_BYTES + 1)
        except FileNotFoundError:
            raise DiffMissing(str(path)) from None
        except OSError as exc:
            raise ReplicationError(f"{path}: cannot read the diff ({exc.strerror or exc})") from None
        if len(data) > MAX_DIFF_BYTES:
            raise ReplicationError(f"{path}: over {MAX_DIFF_BYTES >> 20} MiB, not a replication diff")
        return data

    def where(self, sequence: int) -> str:
        return str(diff_path(self.root, sequence))

    def close(self) -> None:
        pass


class HttpSource:
    """A replication server (``https://planet.openstreetmap.org/replication/minute/`` or a mirror)."""

    def __init__(self, url: str, *, timeout: float = 60.0, retries: int = 3) -> None:
        self.url = url.rstrip("/") + "/"
        self._server = ReplicationServer(self.url)
        # pyosmium's own policy (retry GETs on 5xx and 429 with exponential back-off), with our bounds.
        self._server.retry = Retry(total=retries, backoff_factor=0.5, allowed_methods={"GET"},
                                   status_forcelist=_RETRY_STATUS)
        self._server.set_request_parameter("timeout", timeout)
        self._server.__enter__()  # one session, kept alive between requests

    def latest(self) -> ReplicationState:
        url = self._server.get_state_url(None)
        try:
            return parse_state(self._get(url, STATE_BYTES), url)
        except DiffMissing:
            raise SourceUnavailable(f"{url}: not found (not a replication directory, or not published yet)") from None

    def state(self, sequence: int) -> ReplicationState:
        url = self._server.get_state_url(sequence)
        return parse_state(self._get(url, STATE_BYTES), url)

    def diff(self, sequence: int) -> bytes:
        return self._get(self.where(sequence), MAX_DIFF_BYTES)

    def where(self, sequence: int) -> str:
        return str(self._server.get_diff_url(sequence))

    def close(self) -> None:
        self._server.close()

    def _get(self, url: str, limit: int) -> bytes:
        try:
            with self._server.open_url(self._server.make_request(url)) as resp:
                resp.raise_for_status()
                chunks: list[bytes] = []
                size = 0
                for chunk in resp.iter_content(1 << 16):
                    size += len(chunk)
                    if size > limit:
                        raise ReplicationError(f"{url}: over {limit} bytes, not a replication file")
                    chunks.append(chunk)
                return b"".join(chunks)
        except requests.HTTPError as exc:
            status = exc.response.status_code if exc.response is not None else None
            if status in _GONE:
                raise DiffMissing(url) from None
            raise SourceUnavailable(f"{url}: HTTP {status}") from None
        except requests.RequestException as exc:  # refused, timed out, retries spent, or cut short
            raise SourceUnavailable(f"{url}: {type(exc).__name__}: {str(exc)[:200]}") from None
