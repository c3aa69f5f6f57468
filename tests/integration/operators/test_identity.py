"""Identities: a trusted proxy's user header only from trusted addresses; session cookies are
HttpOnly and SameSite=Strict; form posts need the session's CSRF token."""

from __future__ import annotations

import re

from tests.integration.operators.conftest import GATED, TOKENS, alert_body, bearer, waiting_step


async def test_proxy_user_header_is_trusted_only_from_configured_addresses(
    make_harness, tokens_path
):
    trusted = await make_harness(
        GATED,
        tokens=tokens_path,
        trusted_proxies=["127.0.0.0/8"],
        proxy_user_header="X-Forwarded-User",
    )
    ok = await trusted.client.get("/api/v1/runs", headers={"X-Forwarded-User": "olivia"})
    assert ok.status == 200
    unknown = await trusted.client.get("/api/v1/runs", headers={"X-Forwarded-User": "eve"})
    assert unknown.status == 401


async def test_proxy_user_header_from_elsewhere_is_ignored(make_harness, tokens_path):
    h = await make_harness(
        GATED,
        tokens=tokens_path,
        trusted_proxies=["10.0.0.0/8"],
        proxy_user_header="X-Forwarded-User",
    )
    response = await h.client.get("/api/v1/runs", headers={"X-Forwarded-User": "root"})
    assert response.status == 401


async def _sign_in(h, name):
    form = await h.client.get("/runbooks/login")
    nonce = re.search(r'name="csrf" value="([^"]+)"', await form.text()).group(1)
    response = await h.client.post(
        "/runbooks/login",
        data={"token": TOKENS[name][0], "csrf": nonce},
        allow_redirects=False,
    )
    assert response.status == 303
    return response


async def test_sign_in_sets_a_strict_http_only_cookie_and_forms_need_its_csrf_token(
    make_harness, tokens_path
):
    h = await make_harness(GATED, tokens=tokens_path)
    await h.post(alert_body(), **bearer("alertmanager"))
    await h.settle()
    run_id, step_id = await waiting_step(h, bearer("root"))
    response = await _sign_in(h, "olivia")
    cookie = response.headers["Set-Cookie"]
    assert "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    assert "Secure" not in cookie  # plain HTTP on loopback
    page = await (await h.client.get(f"/runbooks/runs/{run_id}")).text()
    csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
    url = f"/runbooks/runs/{run_id}/steps/{step_id}/approve"
    forged = await h.client.post(url, data={"comment": "x"}, allow_redirects=False)
    assert forged.status == 403
    api = await h.client.post(
        f"/api/v1/runs/{run_id}/steps/{step_id}/approve", json={"comment": "x"}
    )
    assert api.status == 401  # the API never takes the cookie for a change
    done = await h.client.post(url, data={"comment": "fine", "csrf": csrf}, allow_redirects=False)
    assert done.status == 303
    await h.settle()
    detail = await (await h.client.get(f"/api/v1/runs/{run_id}")).json()
    assert detail["status"] == "succeeded"
    assert detail["approvals"][0]["principal"] == "olivia"


async def test_login_without_its_nonce_is_refused_and_cookies_can_be_forced_secure(
    make_harness, tokens_path
):
    h = await make_harness(GATED, tokens=tokens_path, cookie_secure=True)
    refused = await h.client.post(
        "/runbooks/login", data={"token": TOKENS["olivia"][0], "csrf": "x"}
    )
    assert refused.status == 403
    form = await h.client.get("/runbooks/login")
    assert "Secure" in form.headers["Set-Cookie"]
