"""toposm-web's pages confined to their own origin, and what changes something taken from that origin only.

Any page a viewer opens may make the viewer's browser send toposm-web a "simple" cross-site request, one
the browser sends without asking the server first (a form posting ``text/plain``, or ``fetch`` with
``mode: "no-cors"``). The render budgets are counted per client address, the viewer's, so such a page could
spend them. So a request that is not ``GET``/``HEAD``/``OPTIONS`` must carry JSON (``application/json``
cannot be sent cross-site without a CORS preflight, which toposm-web never grants), and where the browser
says where the request comes from it must be this site: ``Sec-Fetch-Site`` ``same-origin`` (or ``none``, a
request the viewer made themselves), ``Origin`` this host and port. A program that says neither (curl, a
script) is served as before: it spends its own address's budget.

Every response carries the headers that confine the pages (``SECURITY_HEADERS``): a Content-Security-Policy
allowing scripts, styles, images and connections from this origin only (the pages have no inline script or
style; Leaflet's blank tile is a ``data:`` image) and no framing, ``X-Frame-Options: DENY`` for browsers
without ``frame-ancestors``, and ``X-Content-Type-Options: nosniff``. The nginx front passes them on, and sends
the last one with the tiles it serves itself (front.py).
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler
from yarl import URL

NOSNIFF = "nosniff"
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": NOSNIFF,
}
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
JSON = "application/json"
OWN_FETCH_SITES = frozenset({"same-origin", "none"})


async def add_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: every response, pages, API, tiles, static files and errors alike."""
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)


def is_own_origin(origin: str, host: str | None) -> bool:
    """``Origin`` names the host and port the request was sent to (its ``Host``, which the nginx front passes
    on as the browser sent it). The scheme is not compared: behind a TLS front toposm-web sees plain HTTP."""
    if host is None or origin == "null":
        return False
    try:
        sender, own = URL(origin), URL(f"http://{host}")
    except ValueError:
        return False
    if sender.scheme not in ("http", "https") or sender.path not in ("", "/") or not sender.host or not own.host:
        return False
    own_port = own.explicit_port or (443 if sender.scheme == "https" else 80)  # Host leaves a default port out
    return (sender.host.lower(), sender.port) == (own.host.lower(), own_port)


def cross_site_refusal(request: web.Request) -> web.HTTPException | None:
    """Why a request that changes something is refused (415 or 403), or None."""
    if request.method in SAFE_METHODS:
        return None
    if request.content_type != JSON:
        return web.HTTPUnsupportedMediaType(
            text=f"415: the body must be JSON (Content-Type: {JSON}), not {request.content_type[:100]}\n"
        )
    fetch_site = request.headers.get("Sec-Fetch-Site")
    if fetch_site is not None and fetch_site not in OWN_FETCH_SITES:
        return web.HTTPForbidden(text=f"403: a request from another site ({fetch_site[:20]}) is refused\n")
    origin = request.headers.get("Origin")
    if origin is not None and not is_own_origin(origin, request.host):
        return web.HTTPForbidden(text="403: a request from another origin is refused\n")
    return None


@web.middleware
async def same_origin_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    refusal = cross_site_refusal(request)
    if refusal is not None:
        raise refusal
    return await handler(request)
