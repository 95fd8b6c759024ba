"""Where replication diffs come from: a local directory or a replication server over HTTP(S).

Both are laid out as planet.openstreetmap.org/replication/minute/ is (``services.osmstore.replication``).
Over HTTP the bodies are read with aiohttp on the follower's own event loop, each download bounded in
size and in total time (``deadline``: a server that drips a byte every few seconds never passes a per-read
timeout), so stopping the follower cancels a download at once (docs/decisions.md says why not a thread).
Failures are sorted into the kinds the follower treats differently:

- ``DiffMissing``: the server answered 404/410 (or the file is not there): a gap;
- ``SourceUnavailable``: the server is down, slow, answers 5xx, took longer than the deadline, or cut a
  download short: try again later;
- ``ReplicationError``: anything else wrong with what was read (a malformed state file, too big).

From a server, a gap or a malformed answer is backed off too (the follower's ``BadAnswer``); from a local
directory it stops the follower.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Protocol

import aiohttp

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
DOWNLOAD_DEADLINE = 600.0  # seconds for one download in all: 256 MB at ~0.5 MB/s
_GONE = (404, 410)
_RETRY_STATUS = (408, 429, 500, 502, 503, 504)
_RETRY_BACKOFF = 0.5  # seconds before the first retry of a request, doubled per retry
USER_AGENT = "toposm-replicate (qbroker)"


class SourceUnavailable(Exception):
    """The source did not answer (or cut the answer short, or took too long): worth trying again later."""


class DiffMissing(Exception):
    """A file the source should have is not there (a gap)."""

    def __init__(self, where: str) -> None:
        super().__init__(f"{where} is missing")
        self.where = where


class _Retryable(Exception):
    """One attempt failed in a way the next attempt may not (5xx, 429, refused, a read timeout, cut short)."""


class ReplicationSource(Protocol):
    remote: bool  # a server (its bad answers are backed off), not the operator's own directory

    async def latest(self) -> ReplicationState: ...  # state.txt: the newest sequence published

    async def state(self, sequence: int) -> ReplicationState: ...  # 000/000/001.state.txt

    async def diff(self, sequence: int) -> bytes: ...  # 000/000/001.osc.gz, as published

    def where(self, sequence: int) -> str: ...  # the diff's path or URL, for messages

    async def close(self) -> None: ...


def is_url(source: str | Path) -> bool:
    return isinstance(source, str) and source.startswith(("http://", "https://"))


def open_source(
    source: str | Path, *, timeout: float = 60.0, deadline: float = DOWNLOAD_DEADLINE, retries: int = 3
) -> ReplicationSource:
    if is_url(source):
        return HttpSource(str(source), timeout=timeout, deadline=deadline, retries=retries)
    return LocalSource(Path(source))


class LocalSource:
    remote = False

    def __init__(self, root: Path) -> None:
        self.root = root

    async def latest(self) -> ReplicationState:
        return await asyncio.to_thread(read_state, self.root / "state.txt")

    async def state(self, sequence: int) -> ReplicationState:
        return await asyncio.to_thread(self._state, sequence)

    async def diff(self, sequence: int) -> bytes:
        return await asyncio.to_thread(self._diff, sequence)

    def where(self, sequence: int) -> str:
        return str(diff_path(self.root, sequence))

    async def close(self) -> None:
        pass

    def _state(self, sequence: int) -> ReplicationState:
        path = state_path(self.root, sequence)
        if not path.is_file():
            raise DiffMissing(str(path))
        return read_state(path)

    def _diff(self, sequence: int) -> bytes:
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


class HttpSource:
    """A replication server (``https://planet.openstreetmap.org/replication/minute/`` or a mirror).

    ``timeout``: seconds to connect and for each read; ``deadline``: seconds for one download in all;
    ``retries``: further attempts of a request after a 5xx/429/408 answer, a refused connection, a read
    timeout or a download cut short, ``_RETRY_BACKOFF`` doubled apart (a ``Retry-After`` is not waited for:
    the follower's own back-off takes over after the last attempt)."""

    remote = True

    def __init__(
        self, url: str, *, timeout: float = 60.0, deadline: float = DOWNLOAD_DEADLINE, retries: int = 3
    ) -> None:
        self.url = url.rstrip("/") + "/"
        self.timeout = timeout
        self.deadline = deadline
        self.retries = retries
        self._session: aiohttp.ClientSession | None = None  # made on the loop, at the first request

    async def latest(self) -> ReplicationState:
        url = self.url + "state.txt"
        try:
            return parse_state(await self._get(url, STATE_BYTES), url)
        except DiffMissing:
            raise SourceUnavailable(f"{url}: not found (not a replication directory, or not published yet)") from None

    async def state(self, sequence: int) -> ReplicationState:
        url = self.url + state_path(Path(), sequence).as_posix()
        return parse_state(await self._get(url, STATE_BYTES), url)

    async def diff(self, sequence: int) -> bytes:
        return await self._get(self.where(sequence), MAX_DIFF_BYTES)

    def where(self, sequence: int) -> str:
        return self.url + diff_path(Path(), sequence).as_posix()

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            # One kept-alive session. Bodies as sent: a diff is published gzipped, and a body the client
            # inflated itself would escape the size cap until after it was inflated.
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, connect=self.timeout, sock_read=self.timeout),
                auto_decompress=False,
                headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"},
            )
        return self._session

    async def _get(self, url: str, limit: int) -> bytes:
        attempt = 0
        while True:
            try:
                return await self._get_once(url, limit)
            except _Retryable as exc:
                if attempt >= self.retries:
                    raise SourceUnavailable(str(exc)) from None
            await asyncio.sleep(_RETRY_BACKOFF * 2**attempt)
            attempt += 1

    async def _get_once(self, url: str, limit: int) -> bytes:
        deadline = asyncio.timeout(self.deadline)
        try:
            async with deadline, self._client().get(url) as resp:
                if resp.status in _GONE:
                    raise DiffMissing(url)
                if resp.status in _RETRY_STATUS:
                    raise _Retryable(f"{url}: HTTP {resp.status}")
                if resp.status != 200:
                    raise SourceUnavailable(f"{url}: HTTP {resp.status}")
                if resp.content_length is not None and resp.content_length > limit:
                    raise ReplicationError(f"{url}: over {limit} bytes, not a replication file")
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.content.iter_any():  # what has arrived, however little or much
                    size += len(chunk)
                    if size > limit:
                        raise ReplicationError(f"{url}: over {limit} bytes, not a replication file")
                    chunks.append(chunk)
                return b"".join(chunks)
        except TimeoutError as exc:
            if deadline.expired():
                raise SourceUnavailable(f"{url}: not read within {self.deadline:g} s (--http-deadline)") from None
            raise _Retryable(f"{url}: {type(exc).__name__}: no answer within {self.timeout:g} s") from None
        except aiohttp.ClientError as exc:  # refused, reset, cut short of its Content-Length, a bad redirect
            raise _Retryable(f"{url}: {type(exc).__name__}: {str(exc)[:200]}") from None
