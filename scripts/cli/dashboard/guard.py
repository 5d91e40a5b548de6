"""Who may read and write: a one-time link, then a cookie no script can read, and same-origin
writes that name their origin.

No lasting secret ever sits in a URL. ``org dashboard`` prints a link with a one-time
``ticket``; the first request that carries it is answered with a redirect to the same page
without it and an ``HttpOnly; SameSite=Strict`` cookie holding the session secret, which is
printed nowhere. The ticket is then spent: read from a browser's command line
(``/proc/<pid>/cmdline``), a shell history or a log afterwards, it opens nothing.

- A read needs the session cookie. A page reached from another site (a link in a chat) comes
  without it (SameSite=Strict); the page then reloads itself once, from its own origin, which
  sends the cookie.
- A write (POST) needs the cookie, an ``Origin`` header that is one of the server's own (a
  request without one is refused: browsers send it on every POST, tools must say it), no
  ``Sec-Fetch-Site`` other than ``same-origin``, and the page's own token in ``X-Org-Token`` (a
  value served inside the page, never in a URL).
Static files (the page's own script and style) carry no data and need nothing.

On loopback, before any of that, the connection's owner is asked of the kernel
(``/proc/net/tcp``): a request from another local user's process is refused whatever it
carries — cookies are shared by every port of 127.0.0.1, so a cookie alone would not tell.
"""
from __future__ import annotations

import hmac
import os
import secrets
import threading

from starlette.requests import Request

from scripts.cli.dashboard.errors import Refused

HEADER = "x-org-token"
COOKIE = "org_session"
TICKET = "ticket"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
_AGAIN = "again"


def peer_uid(peer_port: int, server_port: int) -> int | None:
    """The uid owning the loopback TCP socket whose local port is ``peer_port`` and remote port is
    ``server_port`` (the client's side of a connection to us), from the kernel's tables; None when
    there is none (a client on another machine)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 7 and int(fields[1].rsplit(":", 1)[1], 16) == peer_port \
                    and int(fields[2].rsplit(":", 1)[1], 16) == server_port:
                return int(fields[7])
    return None


def _same(given: str | None, secret: str) -> bool:
    return bool(given) and hmac.compare_digest(given.encode(), secret.encode())


class Guard:
    """Checks requests against the session and the server's own origins.

    Args:
        ticket: the one-time secret of the printed link (spent at its first use).
        host, port: where the server listens; with the loopback names they make the allowed
            ``Host`` names and ``Origin`` values.
        session, page_token: the cookie's secret and the page's write token (default: fresh).
    """

    def __init__(self, ticket: str, host: str, port: int, *, session: str | None = None,
                 page_token: str | None = None):
        self._ticket: str | None = ticket
        self._lock = threading.Lock()
        self.session = session or secrets.token_urlsafe(32)
        self.page_token = page_token or secrets.token_urlsafe(24)
        self.hosts = sorted({host, *LOOPBACK})
        self.origins = {f"http://{h}:{port}" for h in self.hosts} | {f"http://[{h}]:{port}" for h in self.hosts
                                                                    if ":" in h}

    def same_user(self, request: Request) -> None:
        """Raises Refused when a loopback client's socket belongs to another local user."""
        client, server = request.client, request.scope.get("server")
        if client is None or server is None or client.host not in ("127.0.0.1", "::1", "::ffff:127.0.0.1"):
            return
        uid = peer_uid(client.port, server[1])
        if uid is not None and uid != os.getuid():
            raise Refused("other_user", f"a request from another user of this machine (uid {uid}) was refused",
                          "open the dashboard as the user who started it")

    def spend(self, given: str | None) -> bool:
        """True once for the printed ticket (constant-time); False for any other value, or again."""
        with self._lock:
            if self._ticket is None or not _same(given, self._ticket):
                return False
            self._ticket = None
            return True

    def cookie(self) -> str:
        """The ``Set-Cookie`` value that opens the dashboard in this browser."""
        return f"{COOKIE}={self.session}; HttpOnly; SameSite=Strict; Path=/"

    def has_session(self, request: Request) -> bool:
        return _same(request.cookies.get(COOKIE), self.session)

    async def read(self, request: Request) -> None:
        """Raises Refused unless the request carries the session cookie (and comes from this user)."""
        self.same_user(request)
        if not self.has_session(request):
            raise Refused("no_session", "this dashboard opens only from the link 'org dashboard' printed, once",
                          "open that link in your browser (a used link opens nothing: restart 'org dashboard' "
                          "for a new one)")

    def may_reload(self, request: Request) -> bool:
        """A page request without the cookie that may come from another site: reload it once."""
        return request.method == "GET" and _AGAIN not in request.query_params \
            and request.headers.get("sec-fetch-site") not in ("same-origin",)

    async def write(self, request: Request) -> None:
        """Raises Refused for a write without its own ``Origin``, from another site, without the
        session cookie or without the page's token."""
        self.same_user(request)
        site = request.headers.get("sec-fetch-site")
        origin = request.headers.get("origin")
        if origin is None or origin not in self.origins or (site is not None and site != "same-origin"):
            raise Refused("cross_site", f"a write from another site (or naming none) was refused (origin "
                                        f"{origin or '-'}, sec-fetch-site {site or '-'})",
                          "act from the dashboard page itself")
        await self.read(request)
        if not _same(request.headers.get(HEADER), self.page_token):
            raise Refused("bad_token", "this write does not carry the page's token",
                          "act from the dashboard page itself")
