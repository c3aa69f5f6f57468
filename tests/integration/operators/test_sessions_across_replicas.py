"""Web sessions, sign-in nonces and the sign-in throttle hold across replicas: two servers on one
database (SQLite file and Postgres), as two replicas behind one Service. Sign-in, sign-out,
expiry and revocation are audit events that name the principal, never the session id."""

from __future__ import annotations

import hashlib
import json
import re

import yaml

import remediator.app as app_mod
from remediator.adapters.http import auth as http_auth
from remediator.adapters.http import pages
from tests.integration.operators.conftest import GATED, TOKENS, bearer, write_tokens

WRONG = "not-a-known-token-at-all"
SECRET = "a-session-secret-shared-by-replicas"


async def _replicas(make_harness, tokens_path, **overrides):
    values = {"tokens": tokens_path, "session_secret": SECRET} | overrides
    return await make_harness(GATED, **values), await make_harness(GATED, **values)


def _csrf(text: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', text).group(1)


async def _nonce(h) -> str:
    return _csrf(await (await h.client.get("/runbooks/login")).text())


async def _post_login(h, nonce: str, token: str, **cookies: str):
    return await h.client.post(
        "/runbooks/login",
        data={"token": token, "csrf": nonce},
        cookies={pages.LOGIN_NONCE: nonce, **cookies},
        allow_redirects=False,
    )


async def _sign_in(h, name: str = "olivia") -> str:
    """Sign ``name`` in on ``h``'s page; the session cookie's value."""
    response = await _post_login(h, await _nonce(h), TOKENS[name][0])
    assert response.status == 303, await response.text()
    return response.cookies[http_auth.COOKIE].value


def _with(cookie: str) -> dict[str, str]:
    return {"Cookie": f"{http_auth.COOKIE}={cookie}"}


async def _sign_out(h, cookie: str) -> None:
    page = await h.client.get("/runbooks", headers=_with(cookie))
    assert page.status == 200
    out = await h.client.post(
        "/runbooks/logout",
        data={"csrf": _csrf(await page.text())},
        headers=_with(cookie),
        allow_redirects=False,
    )
    assert out.status == 303


async def _events(h, kind: str) -> list[dict]:
    response = await h.client.get(
        "/api/v1/audit/events", params={"kind": kind}, headers=bearer("ada")
    )
    assert response.status == 200, await response.text()
    return list((await response.json())["items"])


async def test_signing_out_on_one_replica_refuses_the_cookie_on_the_other(
    make_harness, tokens_path
):
    a, b = await _replicas(make_harness, tokens_path)
    cookie = await _sign_in(a)
    assert (await b.client.get("/api/v1/runs", headers=_with(cookie))).status == 200
    page = await b.client.get("/runbooks", headers=_with(cookie))
    csrf = _csrf(await page.text())
    await _sign_out(a, cookie)
    assert (await b.client.get("/api/v1/runs", headers=_with(cookie))).status == 401
    index = await b.client.get("/runbooks", headers=_with(cookie), allow_redirects=False)
    assert (index.status, index.headers["Location"]) == (303, "/runbooks/login")
    # The CSRF token B handed out died with the session.
    again = await b.client.post(
        "/runbooks/logout", data={"csrf": csrf}, headers=_with(cookie), allow_redirects=False
    )
    assert again.status in (401, 403)


async def test_a_sign_in_nonce_used_on_one_replica_is_refused_on_the_other(
    make_harness, tokens_path
):
    a, b = await _replicas(make_harness, tokens_path)
    nonce = await _nonce(a)
    assert (await _post_login(a, nonce, TOKENS["olivia"][0])).status == 303
    replayed = await _post_login(b, nonce, TOKENS["olivia"][0])
    assert replayed.status == 403
    assert http_auth.COOKIE not in replayed.cookies


async def test_failed_sign_ins_on_one_replica_throttle_the_other(make_harness, tokens_path):
    a, b = await _replicas(make_harness, tokens_path)
    for _ in range(3):
        assert (await _post_login(a, await _nonce(a), WRONG)).status == 401
    for _ in range(2):
        wrong = await b.client.get("/api/v1/runs", headers={"Authorization": f"Bearer {WRONG}"})
        assert wrong.status == 401
    # Five failures from this address over two replicas: both refuse the sixth attempt.
    refused = await _post_login(a, await _nonce(a), TOKENS["olivia"][0])
    assert refused.status == 429
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    api = await b.client.get("/api/v1/runs", headers={"Authorization": f"Bearer {WRONG}"})
    assert api.status == 429
    assert (await _post_login(b, await _nonce(b), TOKENS["olivia"][0])).status == 429
    a.components.clock.advance(61)
    assert (await _post_login(b, await _nonce(b), TOKENS["olivia"][0])).status == 303


async def test_an_expired_session_is_refused_everywhere_and_its_end_is_audited(
    make_harness, tokens_path
):
    a, b = await _replicas(make_harness, tokens_path, session_ttl=600)
    cookie = await _sign_in(a)
    a.components.clock.advance(599)
    assert (await b.client.get("/api/v1/runs", headers=_with(cookie))).status == 200
    a.components.clock.advance(2)
    assert (await b.client.get("/api/v1/runs", headers=_with(cookie))).status == 401
    assert (await a.client.get("/api/v1/runs", headers=_with(cookie))).status == 401
    assert await _events(b, "session.ended") == []
    assert await app_mod.sweep_sessions(b.components) == 1
    assert await app_mod.sweep_sessions(a.components) == 0  # ended once, whoever sweeps
    [ended] = await _events(a, "session.ended")
    assert (ended["actor"], ended["reason"]) == ("olivia", "expired")


async def test_sign_in_and_sign_out_are_audited_without_the_session_id(make_harness, tokens_path):
    a, b = await _replicas(make_harness, tokens_path)
    cookie = await _sign_in(a)
    await _sign_out(b, cookie)
    [started] = await _events(b, "session.started")
    [ended] = await _events(a, "session.ended")
    assert started["actor"] == ended["actor"] == "olivia"
    assert ended["reason"] == "logout"
    reference = hashlib.sha256(cookie.encode()).hexdigest()
    assert started["data"]["session"] == ended["data"]["session"] == reference[:12]
    written = json.dumps([started, ended])
    assert cookie not in written
    assert reference not in written
    assert TOKENS["olivia"][0] not in written
    verified = await a.client.get("/api/v1/audit/verify", headers=bearer("ada"))
    assert verified.status == 200
    assert (await verified.json())["ok"] is True


async def test_a_session_whose_token_left_the_tokens_file_is_revoked_on_every_replica(
    make_harness, tokens_path, tmp_path
):
    a = await make_harness(GATED, tokens=tokens_path, session_secret=SECRET)
    later = tmp_path / "later"
    later.mkdir()
    entries = yaml.safe_load(write_tokens(later).read_text())
    (later / "tokens.yaml").write_text(
        yaml.safe_dump([e for e in entries if e["name"] != "olivia"])
    )
    b = await make_harness(GATED, tokens=later / "tokens.yaml", session_secret=SECRET)
    cookie = await _sign_in(a)
    assert (await b.client.get("/api/v1/runs", headers=_with(cookie))).status == 401
    assert (await a.client.get("/api/v1/runs", headers=_with(cookie))).status == 401
    [ended] = await _events(a, "session.ended")
    assert (ended["actor"], ended["reason"]) == ("olivia", "revoked")
