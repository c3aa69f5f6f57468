"""A notifier that keeps what it was asked to send, for tests of steps that notify."""

from __future__ import annotations

from typing import Any

from remediator.ports import notify


class FakeNotifier:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send(
        self, *, channel: str, message: str, data: dict[str, Any], idempotency_key: str
    ) -> dict[str, Any]:
        self.sent.append(
            {"channel": channel, "message": message, "data": data, "key": idempotency_key}
        )
        return {"delivered": True, "channel": channel}

    async def deliver(self, notice: notify.Notice) -> dict[str, Any]:
        channel = notice.channel or "default"
        self.sent.append(
            {
                "channel": channel,
                "message": notice.message,
                "data": dict(notice.data),
                "key": notice.idempotency_key,
                "notice": notice,
            }
        )
        return {"delivered": True, "channel": channel}

    def route(self, notice: notify.Notice) -> dict[str, Any]:
        return {"channel": notice.channel or "default", "routed_by": "fake", "type": None}

    def messages(self) -> list[str]:
        return [s["message"] for s in self.sent]


class RecordingServer:
    """A real HTTP server on 127.0.0.1 that records every request and answers with the next
    scripted status (200 once the script is used up)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.statuses: list[int] = []
        self.base = ""

    async def start(self, aiohttp_server: Any) -> RecordingServer:
        from aiohttp import web

        async def record(request: web.Request) -> web.Response:
            self.requests.append(
                {
                    "path": request.path,
                    "headers": dict(request.headers),
                    "json": await request.json(),
                }
            )
            status = self.statuses.pop(0) if self.statuses else 200
            return web.Response(status=status, text="ok" if status < 400 else "refused")

        app = web.Application()
        app.router.add_post("/{tail:.*}", record)
        server = await aiohttp_server(app)
        self.base = f"http://127.0.0.1:{server.port}"
        return self

    def url(self, path: str) -> str:
        return self.base + path

    def bodies(self, path: str | None = None) -> list[Any]:
        return [r["json"] for r in self.requests if path is None or r["path"] == path]
