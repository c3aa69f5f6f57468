"""``pods/exec`` over the ``v4.channel.k8s.io`` websocket protocol, read frame by frame.

kubernetes_asyncio's preloaded exec decodes frames as UTF-8 and drops the exit code, so the
adapter asks for the raw websocket (``_preload_content=False``) and reads the binary frames
itself: ``<channel byte><payload>`` with 1 stdout, 2 stderr, 3 a JSON ``metav1.Status``.
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


async def read_frames(ws: aiohttp.ClientWebSocketResponse, what: str) -> port.ExecResult:
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
        raise port.Unavailable(f"{what}: the exec stream ended without a status")
    return port.ExecResult(
        stdout=bytes(stdout), stderr=bytes(stderr), exit_code=exit_code(status), status=status
    )


def _status(payload: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(payload.decode("utf-8", "replace"))
    except ValueError:
        return {"status": "Failure", "message": payload.decode("utf-8", "replace")}
    return parsed if isinstance(parsed, dict) else {"status": "Failure", "message": str(parsed)}
