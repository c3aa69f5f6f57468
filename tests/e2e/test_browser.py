"""Debian's Chromium (headless, driven by Debian's chromedriver through selenium) against a
real ``remediator serve`` and the simulator: an operator signs in, sees on the first screen of
the run page (at 1,400 x 1,000, without scrolling) the pods the drain will evict and the Approve
button, sees the node cordoned by the run in the fleet view, approves with a comment, gets a
confirmation and watches the run finish with its bug report; an auditor follows the run's audit
link, filters the trail and finds the export links, sees no approve button, and a forged post is
refused. Screenshots are saved in the test's ``screenshots`` directory;
``CONSOLE_SCREENSHOTS=docs`` also writes the README's ``docs/console.png``.
"""

from __future__ import annotations

import os
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

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

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
  - id: bug-report
    action: gpu.collect_bug_report
    params: {safe_mode: true, timeout_seconds: 60}
"""
SIM_TOKEN = "browser-sim-token"


@pytest.fixture(scope="module")
def tmp_module(tmp_path_factory):
    return tmp_path_factory.mktemp("browser")


@pytest.fixture(scope="module")
def sim(tmp_module):
    tmp_path = tmp_module
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
            "--bug-report-seconds",
            "0.5",
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


@pytest.fixture(scope="module")
def server(tmp_module, sim):
    tmp_path = tmp_module
    env = {
        "REMEDIATOR_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}",
        "REMEDIATOR_RULES": str(write_playbooks(tmp_path / "rules", DRAIN)),
        "REMEDIATOR_TOKENS": str(write_tokens(tmp_path)),
        "REMEDIATOR_POLL_INTERVAL": "0.1",
        "REMEDIATOR_KUBERNETES__MODE": "url",
        "REMEDIATOR_KUBERNETES__URL": sim,
        "REMEDIATOR_KUBERNETES__TOKEN": SIM_TOKEN,
        "REMEDIATOR_GUARDS__MAX_PERCENT": "100",
        "REMEDIATOR_ARTIFACT_DIR": str(tmp_path / "artifacts"),
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


@pytest.fixture(scope="module")
def browser(tmp_module):
    from selenium import webdriver

    tmp_path = tmp_module
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
        "--window-size=1400,1000",
        "--hide-scrollbars",
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


def _shoot(driver, tmp_path, name, *, publish=False):
    """A screenshot of the window among the test's artifacts; the one the README shows
    (``publish``) also goes to ``$CONSOLE_SCREENSHOTS/console.png`` when that is set."""
    directory = tmp_path / "screenshots"
    directory.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(directory / f"{name}.png"))
    if publish and os.environ.get("CONSOLE_SCREENSHOTS"):
        driver.save_screenshot(str(pathlib.Path(os.environ["CONSOLE_SCREENSHOTS"]) / "console.png"))


def _in_viewport(driver, element):
    return driver.execute_script(
        """
        const box = arguments[0].getBoundingClientRect();
        return box.top >= 0 && box.left >= 0 && box.height > 0 &&
               box.bottom <= window.innerHeight && box.right <= window.innerWidth;
        """,
        element,
    )


def _horizontal_overflow(driver):
    return driver.execute_script(
        "return document.documentElement.scrollWidth - document.documentElement.clientWidth;"
    )


def _run_of(server, node):
    response = httpx.get(
        f"{server.url}/api/v1/runs",
        params={"node": node},
        headers={"Authorization": f"Bearer {TOKENS['root'][0]}"},
    )
    [run] = response.json()["items"]
    return run["id"]


def test_operator_decides_on_the_first_screen_and_sees_the_outcome(server, browser, sim, tmp_path):
    from selenium.webdriver.common.by import By

    _post_alert(server, "gpu-node-03")
    _until(lambda: _approvals(server))
    run_id = _run_of(server, "gpu-node-03")
    assert _pod_exists(sim, "research", "jupyter-alice")

    browser.set_window_size(1400, 1000)
    _sign_in(browser, server, "olivia")
    row = browser.find_element(By.CSS_SELECTOR, "#approvals tr.pending-approval")
    assert "gpu-node-03" in row.text
    assert "GPUXidError79" in row.text
    row.find_element(By.LINK_TEXT, f"run {run_id}").click()
    _until(lambda: browser.find_elements(By.CSS_SELECTOR, "#plan tr.evict-pod"))
    assert browser.find_element(By.ID, "run-status").text == "waiting_approval"
    assert browser.execute_script("return window.innerHeight") >= 800  # the window, less its bars
    pods = browser.find_element(By.CSS_SELECTOR, "#plan table.evictions")
    pod = pods.find_element(By.CSS_SELECTOR, "tr.evict-pod")
    assert pod.text.split()[:2] == ["research", "jupyter-alice"]
    approve = browser.find_element(By.CSS_SELECTOR, "form.decision button.approve")
    assert _in_viewport(browser, approve), "Approve needs no scrolling at 1,400 x 1,000"
    assert _in_viewport(browser, pods), "the pods to evict need no scrolling at 1,400 x 1,000"
    assert "0 of 1 approvals" in browser.find_element(By.ID, "decision").text
    assert browser.find_element(By.ID, "alertname").text == "GPUXidError79"
    assert browser.find_element(By.CSS_SELECTOR, "#alert time").get_attribute("title")
    _shoot(browser, tmp_path, "run-decision", publish=True)
    browser.set_window_size(1280, 1000)
    assert _horizontal_overflow(browser) <= 0, "no horizontal scrolling at 1,280 px"
    browser.set_window_size(1400, 1000)

    browser.find_element(By.LINK_TEXT, "Fleet").click()
    node = _until(lambda: browser.find_element(By.ID, "node-gpu-node-03"))
    assert node.get_attribute("data-state") == "cordoned"
    assert "cordoned by run" in node.text
    assert node.find_element(By.LINK_TEXT, f"run {run_id}")
    assert "1 of" in browser.find_element(By.ID, "budgets").text
    _shoot(browser, tmp_path, "fleet")
    browser.find_element(By.PARTIAL_LINK_TEXT, "1 cordoned").click()  # only the cordoned nodes
    node = _until(lambda: browser.find_element(By.ID, "node-gpu-node-03"))
    shown = browser.find_elements(By.CSS_SELECTOR, "tr.node")
    assert [row.get_attribute("data-state") for row in shown] == ["cordoned"]
    assert browser.find_element(By.ID, "all-nodes")
    node.find_element(By.LINK_TEXT, f"run {run_id}").click()

    form = _until(lambda: browser.find_element(By.CSS_SELECTOR, "form.decision"))
    form.find_element(By.NAME, "comment").send_keys("drain approved from the browser")
    form.find_element(By.CSS_SELECTOR, "button.approve").click()
    flash = _until(lambda: browser.find_element(By.ID, "flash"))
    assert "You approved step drain" in flash.text
    assert "drain approved from the browser" in flash.text
    _until(lambda: browser.find_element(By.ID, "run-status").text == "succeeded", timeout=40)
    statuses = _until(
        lambda: (
            [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".step-status")]
            == ["succeeded"] * 3
            and browser.find_elements(By.CSS_SELECTOR, "#steps .artifact")
        )
    )
    assert statuses
    assert not _pod_exists(sim, "research", "jupyter-alice")
    assert browser.find_elements(By.CSS_SELECTOR, "button.approve") == []
    artifact = browser.find_element(By.CSS_SELECTOR, "#steps .artifact")
    assert len(artifact.find_element(By.CSS_SELECTOR, ".sha256").text) == 64
    assert browser.find_elements(By.CSS_SELECTOR, "#links a.artifact-link")
    assert browser.find_element(By.CSS_SELECTOR, "#steps progress.drain")
    kinds = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#events tr.event")]
    assert any("approval" in kind for kind in kinds)
    _shoot(browser, tmp_path, "run-finished")


def test_an_auditor_filters_the_trail_exports_it_and_cannot_approve(server, browser, tmp_path):
    from selenium.webdriver.common.by import By

    _post_alert(server, "gpu-node-04")
    [pending] = _until(lambda: [a for a in _approvals(server) if a["run"]["node"] == "gpu-node-04"])
    run_id, step_id = pending["run"]["id"], pending["step"]["id"]
    _sign_in(browser, server, "ada")
    browser.get(f"{server.url}/runbooks/runs/{run_id}")
    _until(lambda: browser.find_element(By.ID, "run-status").text == "waiting_approval")
    assert browser.find_elements(By.CSS_SELECTOR, "button.approve") == []
    assert browser.find_elements(By.CSS_SELECTOR, "form.decision") == []

    browser.find_element(By.ID, "audit-link").click()
    _until(lambda: browser.find_elements(By.CSS_SELECTOR, "#audit-events tr.event"))
    runs = {link.text for link in browser.find_elements(By.CSS_SELECTOR, "#audit-events td a")}
    assert runs == {f"run {run_id}"}
    export = browser.find_element(By.ID, "export-csv").get_attribute("href")
    assert f"run={run_id}" in export
    assert "format=csv" in export

    browser.get(f"{server.url}/runbooks/audit")
    filters = browser.find_element(By.ID, "filters")
    filters.find_element(By.NAME, "node").send_keys("gpu-node-04")
    filters.find_element(By.NAME, "kind").send_keys("run.created")
    filters.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    _until(lambda: "node=gpu-node-04" in browser.current_url)
    rows = browser.find_elements(By.CSS_SELECTOR, "#audit-events tr.event")
    assert len(rows) == 1
    assert "run.created" in rows[0].text
    export = browser.find_element(By.ID, "export-jsonl").get_attribute("href")
    assert "node=gpu-node-04" in export
    assert "kind=run.created" in export
    exported = browser.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        fetch(arguments[0], {credentials: "same-origin"})
          .then((r) => r.text().then((t) => done([r.status, t])), () => done([-1, ""]));
        """,
        export,
    )
    assert exported[0] == 200
    assert '"run.created"' in exported[1]
    _shoot(browser, tmp_path, "audit")

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
    assert [a["step"]["id"] for a in _approvals(server)] == [step_id]
