"""``toposm-web --front nginx``: Debian's nginx answers on the operator's port, toposm-web behind it.

mod_tile answers hits from Apache at static-file speed and only misses go to renderd; this is the same
split. nginx serves a tile straight from the tile root when it exists and its metatile has no expiry marker
(services/toposm/freshness.py: the marker's path is computed from the URL by the ``location`` regex and the
``map`` tables below), with ``X-Tile-State: fresh`` and the zoom band's max-age (``CachePolicy.floor``:
nginx cannot add mod_tile's render-age term or jitter, so a hit's max-age is the band's floor, the shorter
one). Everything else, a missing tile, a tile whose metatile has a marker (dirty, or re-rendered and not yet
seen so), the pages, the API and /metrics, goes to toposm-web, which listens on a Unix socket in a private
runtime directory that only nginx reaches, so the ``X-Real-IP`` nginx sets is the client's address.

nginx runs in the foreground as toposm-web's child (``daemon off``) with its configuration, pid file, logs
and temp files in the runtime directory; it is told to quit when toposm-web stops, and gets SIGTERM from
the kernel if toposm-web dies without stopping it (``PR_SET_PDEATHSIG``). Started as root, its workers run
as the owner of the tile root: the account that writes the tiles can read them, and nothing else is needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import grp
import os
import pwd
import shutil
import signal
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

import structlog

from services.toposm.freshness import MARKER_DIR, nginx_lookup_map
from services.toposm.tilemath import MAX_SUPPORTED_ZOOM

from .access_log import STDOUT
from .cache_policy import CachePolicy
from .same_origin import NOSNIFF

log = structlog.get_logger("toposm.web")
FRONTS = ("nginx",)
PR_SET_PDEATHSIG = 1
TEMP_DIRS = ("body", "proxy", "fastcgi", "uwsgi", "scgi")
# /tiles/z/x/y.png with canonical numbers, each of x and y split into the digits before its last three
# (``_h``) and those three (``_l``), or taken whole when under 1000 (``_s``): see freshness.py for why.
TILE_REGEX = (
    "^/tiles/(?<tile_z>0|[1-9][0-9]?)"
    "/(?:(?<tile_xh>[1-9][0-9]*)(?<tile_xl>[0-9]{3})|(?<tile_xs>0|[1-9][0-9]{0,2}))"
    "/(?:(?<tile_yh>[1-9][0-9]*)(?<tile_yl>[0-9]{3})|(?<tile_ys>0|[1-9][0-9]{0,2}))\\.png$"
)


class FrontError(RuntimeError):
    """The front could not be started (nginx missing, bad port, configuration refused...)."""


@dataclass(frozen=True)
class FrontSettings:
    host: str
    port: int
    tile_root: Path
    cache: CachePolicy
    workers: int = 0  # 0: one per core
    read_timeout: float = 60.0  # longer than toposm-web's render timeout
    access_log: str | None = None  # a file or "-" (standard output): nginx's own ``combined`` log


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _quote(text: str) -> str:
    if any(c in text for c in '"\\;{}$\n'):
        raise FrontError(f"path {text!r} cannot be written into an nginx configuration")
    return f'"{text}"'


def worker_account(tile_root: Path) -> tuple[str | None, int, int]:
    """Who nginx's workers run as (``user`` directive, uid, gid): nobody to choose unless we are root; then
    the tile root's owner, who can read the tiles."""
    if os.geteuid() != 0:
        return None, -1, -1
    st = tile_root.stat()
    return f"{pwd.getpwuid(st.st_uid).pw_name} {grp.getgrgid(st.st_gid).gr_name}", st.st_uid, st.st_gid


def make_runtime_dir(run: Path, uid: int = -1, gid: int = -1) -> None:
    """The temp directories ``nginx_static_preamble`` names, owned by the workers' account (uid >= 0)."""
    for kind in TEMP_DIRS:
        (run / "tmp" / kind).mkdir(parents=True, exist_ok=True)
    if uid >= 0:
        for path in [run, run / "tmp", *(run / "tmp" / k for k in TEMP_DIRS)]:
            os.chown(path, uid, gid)


def access_log_directive(target: str | None) -> str:
    """nginx's ``combined`` format is the Combined Log Format toposm-web writes (services/web/access_log.py),
    escaped the same way. ``-``: nginx's standard output, which is toposm-web's (NginxFront.start)."""
    if target is None:
        return "access_log off;"
    path = "/dev/stdout" if target == STDOUT else str(Path(target).resolve())  # nginx's -p would prefix it
    return f"access_log {_quote(path)} combined;"


def nginx_static_preamble(run: Path, user: str | None, workers: int = 0, access_log: str | None = None) -> str:
    """The process settings and the ``http`` block's static-file settings (left open), with every file
    nginx writes in ``run`` (but an access log asked for); bench/tiles_http.py's plain nginx, the peer, is
    built on the same."""
    temp = "\n".join(
        f"    {kind}_temp_path {_quote(str(run / 'tmp' / kind))};".replace("body_temp", "client_body_temp")
        for kind in TEMP_DIRS
    )
    return f"""{f"user {user};" if user else ""}
worker_processes {workers or "auto"};
pid {_quote(str(run / "nginx.pid"))};
error_log {_quote(str(run / "error.log"))} warn;
daemon off;
events {{ worker_connections 4096; }}
http {{
    {access_log_directive(access_log)}
    server_tokens off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000;
{temp}
    types {{ image/png png; }}
    default_type application/octet-stream;"""


def nginx_config(s: FrontSettings, run: Path, backend: Path, user: str | None) -> str:
    root = s.tile_root.resolve()
    lookup = "\n".join(f'        "{digits}" {value};' for digits, value in nginx_lookup_map())
    zooms = "\n".join(f"        {z} {s.cache.floor(z)};" for z in range(MAX_SUPPORTED_ZOOM + 1))
    # the literal root, not $document_root: under ``alias`` that is the alias's own value (the tile's path)
    marker = f'"{_quote(str(root))[1:-1]}/{MARKER_DIR}/$tile_z/$tile_mxh/$tile_myh/$tile_mxl-$tile_myl"'
    proxy = f"""proxy_pass http://toposm_web;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_set_header X-Real-IP $remote_addr;
            proxy_read_timeout {int(s.read_timeout)}s;"""
    return f"""# written by toposm-web --front nginx at every start: edit services/web/front.py, not this
{nginx_static_preamble(run, user, s.workers, s.access_log)}
    map $tile_xh $tile_mxh {{ "" 0; default $tile_xh; }}
    map $tile_yh $tile_myh {{ "" 0; default $tile_yh; }}
    map $tile_xl$tile_xs $tile_mxl {{
{lookup}
    }}
    map $tile_yl$tile_ys $tile_myl {{
{lookup}
    }}
    map $tile_z $tile_max_age {{
{zooms}
        default {s.cache.minimum};
    }}
    upstream toposm_web {{
        server {_quote("unix:" + str(backend))};
        keepalive 32;
    }}
    server {{
        listen {s.host}:{s.port} backlog=4096;
        root {_quote(str(root))};
        location ~ "{TILE_REGEX}" {{
            # dirty (or re-rendered and not yet seen so) and missing tiles go to toposm-web; a hit costs one
            # stat (the marker's, absent) and the file's open, no try_files stat before it
            error_page 404 470 = @toposm_web;
            if (-f {marker}) {{ return 470; }}
            alias "{_quote(str(root))[1:-1]}/$tile_z/$tile_xh$tile_xl$tile_xs/$tile_yh$tile_yl$tile_ys.png";
            expires $tile_max_age;
            add_header X-Tile-State fresh;
            add_header X-Content-Type-Options {NOSNIFF};
        }}
        location @toposm_web {{
            {proxy}
        }}
        location / {{
            {proxy}
        }}
    }}
}}
"""


def _die_with_parent() -> None:
    # In the child before exec: SIGTERM when toposm-web dies, so a killed toposm-web leaves no nginx behind.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class NginxFront:
    def __init__(self, settings: FrontSettings) -> None:
        self.settings = settings
        self.run = Path(tempfile.mkdtemp(prefix="toposm-web-front-"))
        self.backend = self.run / "backend.sock"  # toposm-web's HTTP server listens here
        self.proc: asyncio.subprocess.Process | None = None
        self.port = settings.port or free_port(settings.host)

    def _owner(self) -> tuple[str | None, int, int]:
        return worker_account(self.settings.tile_root)

    def prepare(self) -> Path:
        """Write the configuration; returns it. The backend socket must exist before ``start``."""
        nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
        if nginx is None:
            raise FrontError("--front nginx needs Debian's nginx (bin/ensure-nginx installs nginx-light)")
        self.nginx = nginx
        self.settings.tile_root.mkdir(parents=True, exist_ok=True)
        user, uid, gid = self._owner()
        make_runtime_dir(self.run, uid, gid)
        conf = self.run / "nginx.conf"
        conf.write_text(
            nginx_config(FrontSettings(**{**self.settings.__dict__, "port": self.port}), self.run, self.backend, user)
        )
        return conf

    def backend_ready(self) -> None:
        """The backend socket exists: let the workers (maybe another account) connect to it."""
        _, uid, gid = self._owner()
        if uid >= 0:
            os.chown(self.backend, uid, gid)
        self.backend.chmod(0o600)

    async def start(self, timeout: float = 15.0) -> None:
        conf = self.run / "nginx.conf"
        self.proc = await asyncio.create_subprocess_exec(
            self.nginx,
            "-p",
            str(self.run),
            "-c",
            str(conf),
            "-e",
            str(self.run / "error.log"),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=None if self.settings.access_log == STDOUT else asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )  # noqa: PLW1509 - prctl only
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if self.proc.returncode is not None:
                raise FrontError(f"nginx exited ({self.proc.returncode}): {self.errors()}")
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection(self.settings.host, self.port)
                writer.close()
                log.info(
                    "nginx front serving", port=self.port, tile_root=str(self.settings.tile_root), runtime=str(self.run)
                )
                return
            await asyncio.sleep(0.05)
        await self.stop()
        raise FrontError(f"nginx did not answer on port {self.port} within {timeout:g}s: {self.errors()}")

    def errors(self) -> str:
        try:
            return (self.run / "error.log").read_text()[-2000:].strip() or "(no error log)"
        except OSError:
            return "(no error log)"

    async def stop(self, grace: float = 0.8) -> None:
        """Graceful quit (open requests finish), then SIGTERM, then SIGKILL, ``grace`` seconds apart (within
        toposm-web's drain timeout); the runtime directory goes."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.returncode is None:
            for sig in (signal.SIGQUIT, signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(sig)
                try:
                    await asyncio.wait_for(proc.wait(), grace)
                    break
                except TimeoutError:
                    continue
        shutil.rmtree(self.run, ignore_errors=True)
