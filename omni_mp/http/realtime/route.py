"""`GET /v1/realtime`: the WebSocket handshake (the HTTP API's key rule; a refusal is an HTTP
answer with a JSON body that says why, through the ASGI WebSocket denial response), the
session's dialect (`OpenAI-Beta: realtime=v1`: beta; otherwise GA), and its receive loop:
bounded in sessions per server process and in idle time, each message decoded as one client
event. A client that goes away mid-answer has its response aborted in every stage."""

from __future__ import annotations

import asyncio
import hmac
import logging
from typing import Any

from fastapi import FastAPI
from fastapi.responses import Response
from starlette.websockets import WebSocket, WebSocketDisconnect

from omni_mp.http.errors import ApiError
from omni_mp.http.realtime.session import RealtimeSession

log = logging.getLogger("omni_mp.http.realtime")
IDLE_CLOSE = 1000  # (normal closure: the reason says idle)
TOO_BIG = 1009


def _refusal(websocket: WebSocket, srv: Any) -> ApiError | None:
    """Why this handshake is refused (None: accepted). The key: `Authorization: Bearer KEY`, or
    the `openai-insecure-api-key.KEY` subprotocol browsers send (they cannot set headers)."""
    key = srv.settings.api_key
    if key is not None:
        got = websocket.headers.get("authorization", "")
        given = got[7:] if got.startswith("Bearer ") else None
        for proto in websocket.scope.get("subprotocols", []):
            if proto.startswith("openai-insecure-api-key."):
                given = proto.removeprefix("openai-insecure-api-key.")
        if given is None or not hmac.compare_digest(given.encode(), key.encode()):
            return ApiError(401, "missing or wrong API key (Authorization: Bearer ...)", code="invalid_api_key")
    if srv.view.text_stage is None:
        return ApiError(400, f"pipeline {srv.view.cfg.name!r} does not chat", code="unsupported_value")
    limit = srv.view.cfg.http.realtime.max_sessions
    if srv.realtime_sessions >= limit:
        return ApiError(429, f"this server holds its limit of {limit} realtime sessions (http.realtime.max_sessions)",
                        type="rate_limit_error", code="too_many_sessions")  # fmt: skip
    return None


def _subprotocol(websocket: WebSocket) -> str | None:
    return "realtime" if "realtime" in websocket.scope.get("subprotocols", []) else None


def add_realtime_route(app: FastAPI, srv: Any) -> None:
    @app.websocket("/v1/realtime")
    async def realtime(websocket: WebSocket) -> None:
        refused = _refusal(websocket, srv)
        if refused is not None:
            from omni_mp.http.schemas import to_json

            body = Response(to_json(refused.body), status_code=refused.status, media_type="application/json")
            await websocket.send_denial_response(body)
            return
        beta = "realtime=v1" in websocket.headers.get("openai-beta", "")
        cfg = srv.view.cfg.http.realtime
        srv.realtime_sessions += 1
        try:
            await websocket.accept(subprotocol=_subprotocol(websocket))
            session = RealtimeSession(srv, websocket.send_text, beta, cfg)
            await session.started()
            await _serve(websocket, session, cfg.idle_timeout_s)
        finally:
            srv.realtime_sessions -= 1


async def _serve(websocket: WebSocket, session: RealtimeSession, idle_s: float) -> None:
    try:
        while True:
            try:
                msg = await asyncio.wait_for(websocket.receive(), idle_s)
            except TimeoutError:
                if session.response is not None:  # an answer is running: not idle
                    continue
                await websocket.close(IDLE_CLOSE, f"idle for {idle_s:g}s (http.realtime.idle_timeout_s)")
                return
            if msg["type"] == "websocket.disconnect":
                return
            raw = msg.get("text") if msg.get("text") is not None else msg.get("bytes")
            if raw is not None:
                await session.handle(raw)
    except (WebSocketDisconnect, RuntimeError, OSError) as err:  # gone mid-send
        log.info("realtime session %s: client gone (%s)", session.id, type(err).__name__)
    finally:
        await session.close()
