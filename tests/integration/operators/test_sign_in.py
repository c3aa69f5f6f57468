"""Sign-in hardening: signing out revokes the session, a sign-in nonce is good for one post, and
wrong tokens are throttled (429 with Retry-After), counted and logged without the token."""

from __future__ import annotations

import base64
import logging
import re

import sqlalchemy as sa

from remediator.adapters.db import tables
from remediator.adapters.http import auth as http_auth
from tests.integration.operators.conftest import GATED, TOKENS, basic, bearer

WRONG = "not-a-known-token-at-all"


def _csrf(text: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', text).group(1)


async def _nonce(h) -> str:
    return _csrf(await (await h.client.get("/runbooks/login")).text())


async def _post_login(h, nonce: str, token: str, **extra: str):
    return await h.client.post(
        "/runbooks/login", data={"token": token, "csrf": nonce, **extra}, allow_redirects=False
    )


async def test_sign_out_revokes_the_cookie_and_its_csrf_token(make_harness, tokens_path):
    h = await make_harness(GATED, tokens=tokens_path)
    signed_in = await _post_login(h, await _nonce(h), TOKENS["olivia"][0])
    assert signed_in.status == 303
    cookie = h.client.session.cookie_jar.filter_cookies(h.client.make_url("/"))[
        http_auth.COOKIE
    ].value
    page = await h.client.get("/runbooks")
    assert page.status == 200
    csrf = _csrf(await page.text())
    out = await h.client.post("/runbooks/logout", data={"csrf": csrf}, allow_redirects=False)
    assert out.status == 303
    # The browser dropped the cookie; someone who kept a copy replays it with its CSRF token.
    replay = {"Cookie": f"{http_auth.COOKIE}={cookie}"}
    api = await h.client.get("/api/v1/runs", headers=replay)
    assert api.status == 401
    again = await h.client.post(
        "/runbooks/logout", data={"csrf": csrf}, headers=replay, allow_redirects=False
    )
    assert again.status in (401, 403)
    index = await h.client.get("/runbooks", headers=replay, allow_redirects=False)
    assert index.status == 303
    assert index.headers["Location"] == "/runbooks/login"


async def test_a_sign_in_nonce_is_accepted_once(make_harness, tokens_path):
    h = await make_harness(GATED, tokens=tokens_path)
    nonce = await _nonce(h)
    first = await _post_login(h, nonce, TOKENS["olivia"][0])
    assert first.status == 303
    h.client.session.cookie_jar.update_cookies({"remediator_login": nonce})
    second = await _post_login(h, nonce, TOKENS["olivia"][0])
    assert second.status == 403


async def test_wrong_tokens_are_throttled_per_address_counted_and_logged(
    make_harness, tokens_path, caplog
):
    h = await make_harness(GATED, tokens=tokens_path)
    caplog.set_level(logging.WARNING, logger="remediator.http.auth")
    for _ in range(5):
        response = await _post_login(h, await _nonce(h), WRONG)
        assert response.status == 401
    refused = await _post_login(h, await _nonce(h), TOKENS["olivia"][0])
    assert refused.status == 429
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    api = await h.client.get("/api/v1/runs", headers={"Authorization": f"Bearer {WRONG}"})
    assert api.status == 429  # the API shares the address's window
    # A valid token on the API always passes: no one can lock Alertmanager out.
    assert (await h.client.get("/api/v1/runs", headers=bearer("olivia"))).status == 200
    h.components.clock.advance(61)
    assert (await _post_login(h, await _nonce(h), TOKENS["olivia"][0])).status == 303
    assert (await h.client.get("/api/v1/runs", headers=bearer("olivia"))).status == 200
    metrics = await (await h.client.get("/metrics")).text()
    assert 'remediator_auth_failures_total{reason="unknown_token"} 5.0' in metrics
    assert 'remediator_auth_failures_total{reason="throttled"} 2.0' in metrics
    failures = [r for r in caplog.records if "authentication failed" in r.getMessage()]
    assert len(failures) == 7
    assert all(WRONG not in r.getMessage() for r in failures)


async def test_api_wrong_tokens_are_throttled_per_address_and_per_name(make_harness, tokens_path):
    h = await make_harness(GATED, tokens=tokens_path)
    for _ in range(5):
        wrong = await h.client.get("/api/v1/runs", headers={"Authorization": f"Bearer {WRONG}"})
        assert wrong.status == 401
    still_wrong = await h.client.get("/api/v1/runs", headers={"Authorization": f"Bearer {WRONG}"})
    assert still_wrong.status == 429
    assert (await h.client.get("/api/v1/runs", headers=bearer("olivia"))).status == 200
    h.components.clock.advance(61)
    # The name is throttled wherever the guesses come from (here: the same address, whose
    # window has passed, and whose failures all name olivia).
    for _ in range(5):
        await _post_login(h, await _nonce(h), WRONG, name="olivia")
    async with h.components.db.write() as conn:
        await conn.execute(
            sa.delete(tables.auth_failures).where(tables.auth_failures.c.key.like("address=%"))
        )
    guess = {"Authorization": "Basic " + base64.b64encode(f"olivia:{WRONG}".encode()).decode()}
    assert (await h.client.get("/api/v1/runs", headers=guess)).status == 429
    assert (await h.client.get("/api/v1/runs", headers=basic("olivia"))).status == 200


async def test_sign_in_works_with_or_without_the_name_and_a_wrong_name_keeps_the_form(
    make_harness, tokens_path
):
    h = await make_harness(GATED, tokens=tokens_path)
    for name in ("", "olivia", "Olivia"):
        h.client.session.cookie_jar.clear()
        signed_in = await _post_login(h, await _nonce(h), TOKENS["olivia"][0], name=name)
        assert signed_in.status == 303, name
        assert signed_in.headers["Location"] == "/runbooks"
    h.client.session.cookie_jar.clear()
    wrong = await _post_login(h, await _nonce(h), TOKENS["olivia"][0], name="Olivia Smith")
    assert wrong.status == 401
    page = await wrong.text()
    assert "That token is not Olivia Smith&#x27;s" in page
    assert 'id="login"' in page
    assert 'value="Olivia Smith"' in page
    unknown = await _post_login(h, _csrf(page), WRONG)
    assert unknown.status == 401
    assert "Unknown token" in await unknown.text()
