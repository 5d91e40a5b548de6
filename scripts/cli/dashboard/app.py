"""The dashboard's routes: four pages (the org, a run, cost, knowledge), a JSON API that mirrors the CLI's ``--json``, and writes.

Reads open a read-only connection per request (state.db is the single source of truth; the
page polls, so nothing runs when nobody watches). Handlers are plain functions run in
Starlette's thread pool; errors become one JSON object ``{"error": {code, message}}`` (the
same ``error[code]: what — what to do`` line as the CLI) with 403/404/409/400.
"""
from __future__ import annotations

import html
from pathlib import Path
from urllib.parse import quote
from typing import Any, Callable

import orjson
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from scripts.cli.dashboard import actions, data
from scripts.cli.dashboard.errors import BadRequest, Refused
from scripts.cli.dashboard.guard import COOKIE, TICKET, Guard
from state_db.connection import connect
from state_db.kernel.errors import IllegalTransition, NotFound, StateError
from state_db.kernel.home import OrgHome

STATIC = Path(__file__).with_name("static")
SECURITY_HEADERS = {
    # the page's own script and style only: no CDN, no inline script, no framing
    "content-security-policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
                               "form-action 'self'; base-uri 'none'",
    "referrer-policy": "no-referrer",
    "x-content-type-options": "nosniff",
    "cache-control": "no-store",
}


class JSON(Response):
    """JSON encoded as the CLI's ``emit_json`` does (orjson, non-string keys, ``str`` fallback)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS, default=str)


def _status_of(exc: StateError) -> int:
    if isinstance(exc, Refused):
        return 403
    if isinstance(exc, NotFound) or exc.code.endswith("not_found"):
        return 404
    if isinstance(exc, IllegalTransition) or exc.code in ("candidate_closed", "confirm_needed", "idempotency_conflict"):
        return 409
    return 400


def _error(exc: StateError, as_json: bool) -> Response:
    line = f"error[{exc.code}]: {exc}"
    if as_json:
        return JSON({"error": {"code": exc.code, "message": str(exc), "line": line}}, status_code=_status_of(exc),
                    headers=SECURITY_HEADERS)
    return PlainTextResponse(line + "\n", status_code=_status_of(exc), headers=SECURITY_HEADERS)


def build_app(home: OrgHome, guard: Guard, spend_cap_usd: float) -> Starlette:
    """The ASGI app for one org home, guarded by ``guard``."""

    def reading(fn: Callable[..., Any]):
        """A GET route: token first, then ``fn(conn, request)`` on a read-only connection."""
        async def endpoint(request: Request) -> Response:
            try:
                await guard.read(request)
                return await run_in_threadpool(_read, fn, request)
            except StateError as exc:
                return _error(exc, True)
        return endpoint

    def _read(fn, request):
        conn = connect(home.db_path, readonly=True)
        try:
            out = fn(conn, request)
        finally:
            conn.close()
        return out if isinstance(out, Response) else JSON(out, headers=SECURITY_HEADERS)

    def writing(fn: Callable[[Request, dict], Any]):
        """A POST route: same-origin and token first, then ``fn(request, body)``."""
        async def endpoint(request: Request) -> Response:
            try:
                await guard.write(request)
                try:
                    body = orjson.loads(await request.body() or b"{}")
                except orjson.JSONDecodeError:
                    raise BadRequest("the body is not JSON", hint="send application/json") from None
                if not isinstance(body, dict):
                    raise BadRequest("the body must be a JSON object")
                return JSON(await run_in_threadpool(fn, request, body), headers=SECURITY_HEADERS)
            except StateError as exc:
                return _error(exc, True)
        return endpoint

    def page(name: str):
        shell = (STATIC / "page.html").read_text()

        async def endpoint(request: Request) -> Response:
            run_id = request.path_params.get("work_id", "")
            here = f"/runs/{quote(run_id, safe='')}" if name == "run" else "/"
            try:
                guard.same_user(request)
            except Refused as exc:
                return _error(exc, False)
            if TICKET in request.query_params:
                # the printed link: spent once for a cookie, then the same page without it
                if not guard.spend(request.query_params[TICKET]):
                    return _error(Refused("link_used", "this dashboard link was used already (or is not this "
                                                       "dashboard's)",
                                          "restart 'org dashboard' for a new link; a browser that opened it "
                                          "keeps its session"), False)
                response = RedirectResponse(here, status_code=303, headers=SECURITY_HEADERS)
                response.set_cookie(COOKIE, guard.session, httponly=True, samesite="strict", path="/")
                return response
            if not guard.has_session(request) and guard.may_reload(request):
                # a link followed from another site arrives without the SameSite=Strict cookie: one
                # reload from this origin sends it (a browser without one then sees the refusal)
                again = html.escape(f"{here}{'&' if '?' in here else '?'}again=1")
                return HTMLResponse(f'<!doctype html><meta http-equiv="refresh" content="0; url={again}">',
                                    headers=SECURITY_HEADERS)
            try:
                await guard.read(request)
            except Refused as exc:
                return _error(exc, False)
            body = (shell.replace("__PAGE__", name).replace("__TOKEN__", html.escape(guard.page_token))
                    .replace("__RUN__", html.escape(run_id)))
            return HTMLResponse(body, headers=SECURITY_HEADERS)
        return endpoint

    def _iteration(request) -> int | None:
        raw = request.query_params.get("iteration")
        if raw in (None, ""):
            return None
        if not raw.isdigit():
            raise BadRequest(f"iteration must be a number (got {raw!r})")
        return int(raw)

    def _by(request) -> str:
        from state_db.queries.cost import BYS
        by = request.query_params.get("by") or "item"
        if by not in BYS:
            raise BadRequest(f"by must be one of {', '.join(BYS)} (got {by!r})")
        return by

    routes = [
        Route("/", page("org")),
        Route("/runs/{work_id}", page("run")),
        Route("/cost", page("cost")),
        Route("/knowledge", page("knowledge")),
        Route("/api/cost", reading(lambda conn, r: data.cost(conn, _by(r), r.query_params.get("since") or None))),
        Route("/api/knowledge", reading(lambda conn, r: data.knowledge(conn))),
        Route("/api/runs/{work_id}/transcript", reading(lambda conn, r: data.transcript(conn, r.path_params["work_id"]))),
        Route("/api/org", reading(lambda conn, r: data.org(conn))),
        Route("/api/plots", reading(lambda conn, r: data.org_plots(conn, spend_cap_usd))),
        Route("/api/decisions", reading(lambda conn, r: data.decisions(conn))),
        Route("/api/candidates", reading(lambda conn, r: data.candidates(conn))),
        Route("/api/runs/{work_id}", reading(lambda conn, r: data.run(conn, r.path_params["work_id"]))),
        Route("/api/runs/{work_id}/plots", reading(lambda conn, r: data.run_plots(conn, r.path_params["work_id"]))),
        Route("/api/runs/{work_id}/diff", reading(lambda conn, r: PlainTextResponse(
            data.diff(home, r.path_params["work_id"], _iteration(r)).decode("utf-8", "replace"),
            headers=SECURITY_HEADERS))),
        Route("/api/decisions/{decision_id}", writing(
            lambda r, body: actions.decide(home, r.path_params["decision_id"], body)), methods=["POST"]),
        Route("/api/candidates/{action}", writing(
            lambda r, body: actions.candidates(home, r.path_params["action"], body)), methods=["POST"]),
        Route("/api/candidates/{candidate_id}/edit", writing(
            lambda r, body: actions.edit_candidate(home, r.path_params["candidate_id"], body)), methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC)),
    ]
    return Starlette(routes=routes, middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=guard.hosts)])
