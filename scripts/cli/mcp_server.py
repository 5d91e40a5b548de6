"""``org mcp``'s server: the org's tools and resources over the Model Context Protocol (stdio).

Built on the official ``mcp`` SDK's low-level ``Server``. Tools are ``scripts/cli/mcp_tools.py``;
an expected error comes back as a tool error whose text is the CLI's one line
(``error[code]: what — what to do``) and whose structured content is {"error": {code, message,
hint}}. Resources are the org (``org://status``) and each run (``org://runs/ID``), as JSON equal
to ``org status --json`` / ``org show ID --json``. A client that subscribes to one gets
``notifications/resources/updated`` when it changes: while anything is subscribed, the server
reads the newest id of state.db's journal (``events``) every ``poll_s`` and, past it, notifies
the org resource on any event and a run's resource on events about that run.

The server runs no agent command itself and reads no secret: every write is a state.db write
plus a wake to the coordinator, exactly as the CLI's.
"""
from __future__ import annotations

import sqlite3
from typing import Any

import anyio
import orjson
import structlog
from mcp import types
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.lowlevel.helper_types import ReadResourceContents
from pydantic import AnyUrl

from scripts.cli import mcp_tools
from scripts.cli.version import version
from state_db.kernel.config import Config
from state_db.connection import connect
from state_db.kernel.errors import NotFound, OrgError
from state_db.kernel.home import OrgHome
from state_db.queries.events import after as events_after, last_id

log = structlog.get_logger("mcp")

STATUS_URI = "org://status"
RUN_PREFIX = "org://runs/"
TRANSCRIPT_SUFFIX = "/transcript"
COST_URI = "org://cost"
JSON = "application/json"
INSTRUCTIONS = ("loop-org runs goals in bounded, verified loops: 'submit' a goal with a workspace and a verify "
                "command, follow it through org://runs/ID (subscribe for updates) or 'show', answer its "
                "'decisions' with 'decide', and read the result with 'diff'.")


def plain(value: Any) -> Any:
    """What the CLI's ``--json`` prints, as JSON-ready Python values."""
    return orjson.loads(orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS, default=str))


class OrgServer:
    """One MCP server over one org home.

    Args:
        home: the org home (its state.db must exist when a tool or resource is read).
        cfg: the org's configuration; ``mcp.tools`` chooses the tools.
        poll_s: how often the journal is read while a resource is subscribed.
    """

    def __init__(self, home: OrgHome, cfg: Config, *, poll_s: float = 0.5):
        self.home, self.cfg, self.poll_s = home, cfg, poll_s
        # loop-org's own version: the SDK would report its own in serverInfo otherwise
        self.server: Server = Server("loop-org", version=version(), instructions=INSTRUCTIONS)
        self.subscribed: set[str] = set()
        self._transcripts: dict[str, tuple] = {}     # subscribed transcript → what it was last seen at
        self.session = None
        self._changed = anyio.Event()
        self._register()

    # -- tools ----------------------------------------------------------------------------
    def _client(self) -> str:
        params = self.server.request_context.session.client_params
        name = params.clientInfo.name if params and params.clientInfo else "unknown"
        return f"mcp:{name}"

    def _register(self) -> None:
        s = self.server

        @s.list_tools()
        async def list_tools() -> list[types.Tool]:
            on = mcp_tools.enabled(self.cfg)
            return [types.Tool(name=t.name, description=t.description, inputSchema=t.schema)
                    for t in mcp_tools.TOOLS if t.name in on]

        @s.call_tool()
        async def call_tool(name: str, arguments: dict) -> types.CallToolResult:
            caller = mcp_tools.Caller(self.home, self.cfg, self._client())
            try:
                value = plain(await anyio.to_thread.run_sync(mcp_tools.call, caller, name, arguments))
            except OrgError as exc:
                log.info("mcp tool refused", tool=name, code=exc.code, via=caller.via)
                return types.CallToolResult(
                    isError=True, content=[types.TextContent(type="text", text=exc.line())],
                    structuredContent={"error": {"code": exc.code, "message": exc.message, "hint": exc.hint}})
            log.info("mcp tool called", tool=name, via=caller.via)
            text = orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()
            return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                        structuredContent=value if isinstance(value, dict) else {"items": value})

        @s.list_resources()
        async def list_resources() -> list[types.Resource]:
            runs = await anyio.to_thread.run_sync(self._runs)
            return [types.Resource(uri=AnyUrl(STATUS_URI), name="org status", mimeType=JSON,
                                   description="the org at a glance (org status --json)"),
                    types.Resource(uri=AnyUrl(COST_URI), name="org cost", mimeType=JSON,
                                   description="tokens and dollars by work item, goal family, model and day "
                                               "(org cost --by … --json)")] + [
                types.Resource(uri=AnyUrl(RUN_PREFIX + r["id"]), name=f"run {r['id']}", mimeType=JSON,
                               description=f"{r['status']}: {r['goal'][:80]}") for r in runs]

        @s.list_resource_templates()
        async def list_templates() -> list[types.ResourceTemplate]:
            return [types.ResourceTemplate(uriTemplate=RUN_PREFIX + "{id}", name="run", mimeType=JSON,
                                           description="one run (org show ID --json)"),
                    types.ResourceTemplate(uriTemplate=RUN_PREFIX + "{id}" + TRANSCRIPT_SUFFIX, name="transcript",
                                           mimeType=JSON, description="what the doer did in one run, act by act "
                                                                      "(org show ID --transcript --json)")]

        @s.read_resource()
        async def read_resource(uri: AnyUrl) -> list[ReadResourceContents]:
            value = await anyio.to_thread.run_sync(self._read, str(uri))
            return [ReadResourceContents(content=orjson.dumps(plain(value)).decode(), mime_type=JSON)]

        @s.subscribe_resource()
        async def subscribe(uri: AnyUrl) -> None:
            self.session = self.server.request_context.session
            self.subscribed.add(str(uri))
            self._changed.set()

        @s.unsubscribe_resource()
        async def unsubscribe(uri: AnyUrl) -> None:
            self.subscribed.discard(str(uri))

    # -- resources ------------------------------------------------------------------------
    def _caller(self) -> mcp_tools.Caller:
        return mcp_tools.Caller(self.home, self.cfg, "mcp")

    def _runs(self) -> list[dict]:
        st = mcp_tools.status(self._caller(), {})
        return st["work"]["active"] + st["work"]["recent_ended"]

    def _read(self, uri: str) -> dict:
        if uri == STATUS_URI:
            return mcp_tools.status(self._caller(), {})
        if uri == COST_URI:
            return mcp_tools.cost(self._caller(), {})
        if uri.startswith(RUN_PREFIX) and uri.endswith(TRANSCRIPT_SUFFIX):
            return mcp_tools.transcript(self._caller(), {"id": uri.removeprefix(RUN_PREFIX)[:-len(TRANSCRIPT_SUFFIX)]})
        if uri.startswith(RUN_PREFIX):
            return mcp_tools.show(self._caller(), {"id": uri.removeprefix(RUN_PREFIX)})
        raise NotFound(f"no resource {uri}", hint=f"read {STATUS_URI}, {COST_URI}, {RUN_PREFIX}ID or "
                                                  f"{RUN_PREFIX}ID{TRANSCRIPT_SUFFIX}")

    def _events_after(self, after: int | None) -> tuple[int, list[tuple[str, str]]]:
        """The journal's newest id, and (subject, data) of the events after ``after``."""
        conn = connect(self.home.db_path, readonly=True)
        try:
            newest = last_id(conn)
            if after is None or newest <= after:
                return newest, []
            return newest, [(e.subject or "", orjson.dumps(e.data).decode())
                            for e in events_after(conn, after, upto=newest)]
        finally:
            conn.close()

    def _transcripts_grown(self) -> set[str]:
        """The subscribed transcripts that changed since the last look (``transcript.version``)."""
        from state_db.queries.transcript import version
        uris = [u for u in set(self.subscribed) if u.startswith(RUN_PREFIX) and u.endswith(TRANSCRIPT_SUFFIX)]
        if not uris:
            self._transcripts.clear()
            return set()
        conn = connect(self.home.db_path, readonly=True)
        try:
            grown = set()
            for uri in uris:
                seen = version(conn, uri.removeprefix(RUN_PREFIX)[:-len(TRANSCRIPT_SUFFIX)])
                if uri in self._transcripts and self._transcripts[uri] != seen:
                    grown.add(uri)
                self._transcripts[uri] = seen
            return grown
        finally:
            conn.close()

    @staticmethod
    def touched(uris: set[str], events: list[tuple[str, str]]) -> list[str]:
        """Which subscribed resources these journal events change."""
        out = []
        for uri in sorted(uris):
            if uri in (STATUS_URI, COST_URI) and events:
                out.append(uri)
            elif uri.startswith(RUN_PREFIX):
                work_id = uri.removeprefix(RUN_PREFIX).removesuffix(TRANSCRIPT_SUFFIX)
                if any(work_id in subject or work_id in data for subject, data in events):
                    out.append(uri)
        return out

    async def watch(self) -> None:
        """Notify subscribers of changed resources until cancelled."""
        last = None
        while True:
            if not self.subscribed:
                self._changed = anyio.Event()
                await self._changed.wait()
            try:
                newest, events = await anyio.to_thread.run_sync(self._events_after, last)
            except (OrgError, sqlite3.Error) as exc:  # no state.db yet, or busy: try again next round
                log.info("mcp watch waits", reason=str(exc))
                newest, events = last, []
            try:           # a transcript grows with every model response, which the journal does not record
                grown = await anyio.to_thread.run_sync(self._transcripts_grown)
            except (OrgError, sqlite3.Error):
                grown = set()
            touched = set(self.touched(set(self.subscribed), events)) if last is not None else set()
            for uri in sorted(touched | grown):
                await self.session.send_resource_updated(AnyUrl(uri))
            last = newest
            await anyio.sleep(self.poll_s)

    # -- serving --------------------------------------------------------------------------
    def options(self):
        opts = self.server.create_initialization_options(NotificationOptions(resources_changed=False), {})
        # the SDK's low-level server advertises subscribe=False even with a subscribe handler
        opts.capabilities.resources.subscribe = True
        return opts

    async def serve_stdio(self) -> None:
        from mcp.server.stdio import stdio_server
        async with stdio_server() as (read, write), anyio.create_task_group() as tg:
            tg.start_soon(self.watch)
            await self.server.run(read, write, self.options())
            tg.cancel_scope.cancel()
