"""Who may read and write: the token printed at start, and same-origin writes only.

Every page and API route needs the token: in the ``X-Org-Token`` header or, for reads (the link
that was printed) the ``token`` query parameter. A write (POST) must also come from the
dashboard's own origin: a browser's ``Sec-Fetch-Site`` other than ``same-origin`` or an
``Origin`` that is not one of the server's own is refused before the token is looked at, and
the token of a write must be in the header or a form field, never only in the URL or a cookie.
Static files (the page's own script and style) carry no data and need no token.
"""
from __future__ import annotations

import hmac
from urllib.parse import parse_qs

from starlette.requests import Request

from scripts.cli.dashboard.errors import Refused

HEADER = "x-org-token"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class Guard:
    """Checks requests against one token and the server's own origins.

    Args:
        token: the secret printed at start.
        host, port: where the server listens; with the loopback names they make the allowed
            ``Host`` names and ``Origin`` values.
    """

    def __init__(self, token: str, host: str, port: int):
        self.token = token
        self.hosts = sorted({host, *LOOPBACK})
        self.origins = {f"http://{h}:{port}" for h in self.hosts} | {f"http://[{h}]:{port}" for h in self.hosts
                                                                    if ":" in h}

    async def read(self, request: Request) -> None:
        """Raises Refused unless the request carries the token (header or ``?token=``)."""
        self._check(request.headers.get(HEADER) or request.query_params.get("token"))

    async def write(self, request: Request) -> None:
        """Raises Refused for a cross-site request, or one without the token in its header or
        form field."""
        site = request.headers.get("sec-fetch-site")
        origin = request.headers.get("origin")
        if (site is not None and site != "same-origin") or (origin is not None and origin not in self.origins):
            raise Refused("cross_site", f"a write from another site was refused (origin {origin or '-'}, "
                                        f"sec-fetch-site {site or '-'})",
                          "act from the dashboard page itself")
        given = request.headers.get(HEADER)
        if given is None and request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
            given = (parse_qs((await request.body()).decode("utf-8", "replace")).get("token") or [None])[0]
        self._check(given)

    def _check(self, given: str | None) -> None:
        if not given:
            raise Refused("no_token", "this dashboard needs its token",
                          "open the link 'org dashboard' printed (it ends in ?token=...)")
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            raise Refused("bad_token", "the token does not match this dashboard's",
                          "open the link 'org dashboard' printed at its latest start")
