"""The alertmanager channel against the real Alertmanager (Debian's prometheus-alertmanager):
the alert it posts is accepted by /api/v2/alerts, carries the run's labels and ends on resolve.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from remediator.adapters import notify
from remediator.demo.processes import free_port
from remediator.ports import notify as port
from tests.e2e.procs import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
CONFIG = """\
route: {receiver: nowhere, group_wait: 1s, group_interval: 2s}
receivers: [{name: nowhere}]
"""


@pytest.fixture
def alertmanager(tmp_path) -> Iterator[str]:
    if not shutil.which(ALERTMANAGER):
        pytest.fail(f"{ALERTMANAGER} is not installed (apt-get install prometheus-alertmanager)")
    (tmp_path / "am.yml").write_text(CONFIG)
    port_ = free_port()
    with (tmp_path / "am.log").open("wb") as log:
        proc = subprocess.Popen(
            [
                ALERTMANAGER, f"--config.file={tmp_path / 'am.yml'}",
                f"--storage.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port_}", "--cluster.listen-address=",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port_}"
    try:
        wait_for(lambda: _ready(url), 20, what="alertmanager ready")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _notices(url: str) -> list[dict[str, Any]]:
    alerts: list[dict[str, Any]] = httpx.get(f"{url}/api/v2/alerts", timeout=5).json()
    return [a for a in alerts if a["labels"].get("alertname") == "RemediatorNotice"]


async def test_the_real_alertmanager_takes_the_notice_and_ends_it_on_resolve(alertmanager):
    channel = notify.NotifyChannel.model_validate({"type": "alertmanager", "url": alertmanager})
    notifier = notify.WebhookNotifier(
        {"am": channel}, external_url="https://remediator.example.test"
    )
    notice = port.Notice(
        channel="am",
        message="GPU 3 on gpu-node-07 is cordoned; the drain waits for approval",
        idempotency_key="run-12-step-40",
        data={"step": "drain"},
        labels={"alertname": "GPUXidError", "severity": "critical", "xid": "79", "team": "ml"},
        run_id=12,
        playbook="gpu-xid-error",
        node="gpu-node-07",
        gpu="3",
        at=dt.datetime.now(dt.UTC),
    )
    try:
        out = await notifier.deliver(notice)
        assert out["delivered"] is True
        [alert] = wait_for(lambda: _notices(alertmanager), 10, what="the notice in Alertmanager")
        assert alert["labels"]["remediator_alertname"] == "GPUXidError"
        assert alert["labels"]["team"] == "ml"  # existing routes on team apply
        assert alert["labels"]["node"] == "gpu-node-07"
        assert alert["labels"]["remediator_notice"] == "remediator-run-12"
        assert alert["annotations"]["summary"] == notice.message
        assert alert["generatorURL"] == "https://remediator.example.test/runbooks/runs/12"
        assert alert["status"]["state"] == "active"

        resolved = dataclasses.replace(notice, resolve=True, at=dt.datetime.now(dt.UTC))
        await notifier.deliver(resolved)
        wait_for(lambda: not _notices(alertmanager), 10, what="the notice resolved")
    finally:
        await notifier.close()
