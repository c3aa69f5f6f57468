"""``/`` opens the console instead of answering a JSON 404."""

from __future__ import annotations

from tests.integration.operators.conftest import GATED


async def test_the_root_redirects_to_the_console(make_harness):
    h = await make_harness(GATED)
    response = await h.client.get("/", allow_redirects=False)
    assert response.status == 303
    assert response.headers["Location"] == "/runbooks"
    page = await h.client.get("/")
    assert page.status == 200
    assert page.content_type == "text/html"
