"""Debian's Chromium (headless, driven by Debian's chromedriver through selenium) against a
real ``remediator serve``: an operator signs in, sees the pending drain, approves it with a
comment and watches it finish; an auditor sees no approve button and a forged post is refused."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import ROOT
from tests.e2e import procs
from tests.integration.conftest import write_playbooks
from tests.integration.operators.conftest import TOKENS, alert_body, write_tokens

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

CHROMIUM = pathlib.Path("/usr/bin/chromium")
CHROMEDRIVER = pathlib.Path("/usr/bin/chromedriver")


DRAIN = """
name: drain-on-xid
match: {alertname: GPUXidError79}
steps:
  - {id: cordon, action: node.cordon}
  - id: drain
    action: node.drain
    description: drain the node
    requires_approval: true
    params: {ignore_daemonsets: true, delete_emptydir_data: true, force: true,
             timeout_seconds: 60}
"""
SIM_TOKEN = "browser-sim-token"


@pytest.fixture
def sim(tmp_path):
    port = procs.free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "remediator",
            "sim",
            "--no-tls",
            "--listen",
            f"127.0.0.1:{port}",
            "--token",
            SIM_TOKEN,
            "--time-scale",
            "0.02",
            "--kubeconfig",
            str(tmp_path / "kubeconfig"),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {SIM_TOKEN}"}

    def up():
        try:
            return httpx.get(f"{url}/version", headers=headers).status_code == 200
        except httpx.TransportError:
            return False

    try:
        _until(up)
        yield url
    finally:
        process.terminate()
        process.wait(20)


@pytest.fixture
def server(tmp_path, sim):
    env = {
        "REMEDIATOR_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}",
        "REMEDIATOR_RULES": str(write_playbooks(tmp_path / "rules", DRAIN)),
        "REMEDIATOR_TOKENS": str(write_tokens(tmp_path)),
        "REMEDIATOR_POLL_INTERVAL": "0.1",
        "REMEDIATOR_KUBERNETES__MODE": "url",
        "REMEDIATOR_KUBERNETES__URL": sim,
        "REMEDIATOR_KUBERNETES__TOKEN": SIM_TOKEN,
        "REMEDIATOR_GUARDS__MAX_PERCENT": "100",
    }
    serve = procs.Serve(env=env, log=tmp_path / "serve.log").start()
    try:
        yield serve
    finally:
        serve.terminate()


def _pod_exists(sim, namespace, name):
    response = httpx.get(
        f"{sim}/api/v1/namespaces/{namespace}/pods/{name}",
        headers={"Authorization": f"Bearer {SIM_TOKEN}"},
    )
    return response.status_code == 200


@pytest.fixture
def browser(tmp_path):
    from selenium import webdriver

    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    assert not missing, f"install Debian's chromium and chromium-driver (missing: {missing})"
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(flag)
    service = webdriver.ChromeService(executable_path=str(CHROMEDRIVER))
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _post_alert(server, node):
    response = httpx.post(
        f"{server.url}/api/v1/alerts",
        content=alert_body(node=node),
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {TOKENS['alertmanager'][0]}",
        },
    )
    assert response.status_code == 200


def _until(predicate, timeout=20.0):
    """Poll ``predicate``. While a click's navigation is under way the element it looks for
    may be missing or stale for a moment; that is "not yet", not a failure."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (NoSuchElementException, StaleElementReferenceException) as e:
            value, last = None, e
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(f"condition not met (last error: {last})")


def _sign_in(driver, server, name):
    from selenium.webdriver.common.by import By

    driver.delete_all_cookies()
    driver.get(f"{server.url}/runbooks")
    assert driver.current_url.endswith("/runbooks/login")
    driver.find_element(By.NAME, "token").send_keys(TOKENS[name][0])
    driver.find_element(By.CSS_SELECTOR, "#login button").click()
    _until(lambda: driver.current_url.endswith("/runbooks"))
    assert name in driver.find_element(By.ID, "who").text


def _approvals(server):
    response = httpx.get(
        f"{server.url}/api/v1/approvals",
        headers={"Authorization": f"Bearer {TOKENS['root'][0]}"},
    )
    return response.json()["items"]


def test_operator_approves_a_pending_drain_and_an_auditor_cannot(server, browser, sim):
    from selenium.webdriver.common.by import By

    _post_alert(server, "gpu-node-03")
    _until(lambda: _approvals(server))
    assert _pod_exists(sim, "research", "jupyter-alice")

    _sign_in(browser, server, "olivia")
    row = browser.find_element(By.CSS_SELECTOR, "#approvals tr.pending-approval")
    assert "gpu-node-03" in row.text
    assert "GPUXidError79" in row.text
    row.find_element(By.LINK_TEXT, "run 1").click()
    _until(lambda: "jupyter-alice" in browser.find_element(By.ID, "plan").text)
    pod = browser.find_element(By.CSS_SELECTOR, "#plan tr.evict-pod")
    assert pod.text.split()[:2] == ["research", "jupyter-alice"]
    assert browser.find_element(By.ID, "run-status").text == "waiting_approval"
    form = browser.find_element(By.CSS_SELECTOR, "form.decision[action$='/approve']")
    form.find_element(By.NAME, "comment").send_keys("drain approved from the browser")
    form.find_element(By.CSS_SELECTOR, "button.approve").click()
    _until(lambda: browser.find_element(By.ID, "run-status").text == "succeeded", timeout=60)
    statuses = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".step-status")]
    assert statuses == ["succeeded", "succeeded"]
    assert not _pod_exists(sim, "research", "jupyter-alice")
    assert browser.find_elements(By.CSS_SELECTOR, "button.approve") == []

    _post_alert(server, "gpu-node-04")
    [pending] = _until(lambda: _approvals(server))
    run_id, step_id = pending["run"]["id"], pending["step"]["id"]
    _sign_in(browser, server, "ada")
    browser.get(f"{server.url}/runbooks/runs/{run_id}")
    _until(lambda: browser.find_element(By.ID, "run-status").text == "waiting_approval")
    assert browser.find_elements(By.CSS_SELECTOR, "button.approve") == []
    assert browser.find_elements(By.CSS_SELECTOR, "form.decision") == []
    forged = browser.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        const body = new URLSearchParams({comment: "forged", csrf: "guess"});
        fetch(arguments[0], {method: "POST", body, credentials: "same-origin"})
          .then((r) => done(r.status), () => done(-1));
        """,
        f"/runbooks/runs/{run_id}/steps/{step_id}/approve",
    )
    assert forged == 403
    api_forged = browser.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        fetch(arguments[0], {method: "POST", body: '{"comment": "forged"}',
                             headers: {"Content-Type": "application/json"},
                             credentials: "same-origin"})
          .then((r) => done(r.status), () => done(-1));
        """,
        f"/api/v1/runs/{run_id}/steps/{step_id}/approve",
    )
    assert api_forged == 401
    assert _approvals(server)[0]["step"]["id"] == step_id
