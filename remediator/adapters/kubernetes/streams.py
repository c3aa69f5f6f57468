"""``pods/exec`` over the ``v4.channel.k8s.io`` websocket protocol, read frame by frame.

kubernetes_asyncio's preloaded exec decodes frames as UTF-8 and drops the exit code, so the
adapter asks for the raw websocket (``_preload_content=False``) and reads the binary frames
itself: ``<channel byte><payload>`` with 1 stdout, 2 stderr, 3 a JSON ``metav1.Status``.

A stream that ends (or breaks) before the status frame, or a status that reports a server-side
failure (5xx) instead of the command's own exit, is ``ExecInterrupted``: the command may or may
not have run, and only the caller knows whether running it again is harmless.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from remediator.ports import cluster as port

STDOUT, STDERR, STATUS = 1, 2, 3


def exit_code(status: dict[str, Any]) -> int | None:
    """0 for Success; the ExitCode cause for NonZeroExitCode; None for other failures."""
    if status.get("status") == "Success":
        return 0
    causes = (status.get("details") or {}).get("causes") or []
    for cause in causes:
        if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
            try:
                return int(cause.get("message", ""))
            except ValueError:
                return None
    return None


SERVER_FAILURES = frozenset({"InternalError", "ServiceUnavailable", "Timeout", "ServerTimeout"})


def is_server_failure(status: dict[str, Any]) -> bool:
    """A Failure status the API server or kubelet gave instead of the command's exit code."""
    if exit_code(status) is not None:
        return False
    code = status.get("code")
    return (isinstance(code, int) and code >= 500) or status.get("reason") in SERVER_FAILURES


async def read_frames(ws: aiohttp.ClientWebSocketResponse, what: str) -> port.ExecResult:
    try:
        result = await _read(ws)
    except (aiohttp.ClientError, ConnectionError) as e:
        raise port.ExecInterrupted(f"{what}: the exec stream broke: {e}") from e
    if result is None:
        close = f" (close code {ws.close_code})" if ws.close_code is not None else ""
        raise port.ExecInterrupted(f"{what}: the exec stream ended without a status{close}")
    if is_server_failure(result.status):
        message = result.status.get("message") or result.status.get("reason")
        code = result.status.get("code")
        raise port.ExecInterrupted(
            f"{what}: {message}", status=code if isinstance(code, int) else None
        )
    return result


async def _read(ws: aiohttp.ClientWebSocketResponse) -> port.ExecResult | None:
    stdout = bytearray()
    stderr = bytearray()
    status: dict[str, Any] | None = None
    async for message in ws:
        if message.type == aiohttp.WSMsgType.BINARY:
            data: bytes = message.data
        elif message.type == aiohttp.WSMsgType.TEXT:
            data = message.data.encode("utf-8")
        else:
            break
        if len(data) < 2:
            continue  # the server's initial empty frame per channel
        channel, payload = data[0], data[1:]
        if channel == STDOUT:
            stdout += payload
        elif channel == STDERR:
            stderr += payload
        elif channel == STATUS:
            status = _status(payload)
    if status is None:
        return None
    return port.ExecResult(
        stdout=bytes(stdout), stderr=bytes(stderr), exit_code=exit_code(status), status=status
    )


def _status(payload: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(payload.decode("utf-8", "replace"))
    except ValueError:
        return {"status": "Failure", "message": payload.decode("utf-8", "replace")}
    return parsed if isinstance(parsed, dict) else {"status": "Failure", "message": str(parsed)}
