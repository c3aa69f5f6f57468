"""Every Xid code of the catalogue reaches the one playbook of its resolution class.

The alert is built as Prometheus would fire it: the labels of the captured Xid 79 body
(dcgm-exporter's gpu, UUID, pci_bus_id, device, modelName, Hostname, DCGM_FI_DRIVER_VERSION,
the workload's pod, Prometheus' instance, job and node) with the matching rule's own labels
(severity, resolution, and xid rendered from the gauge's value).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from remediator.domain import playbooks
from tests.conftest import am_payload
from tests.unit.test_rules_match_prometheus import alert_rules, shipped_playbooks

# code -> (alert rule, playbook), as NVIDIA's Xid catalog groups the resolutions
CATALOGUE = {
    13: ("GPUXidApplication", "gpu-xid-application"),
    31: ("GPUXidApplication", "gpu-xid-application"),
    43: ("GPUXidApplication", "gpu-xid-application"),
    45: ("GPUXidApplication", "gpu-xid-application"),
    48: ("GPUXidErrorECC", "gpu-ecc-uncorrectable"),
    63: ("GPUXidMemory", "gpu-xid-memory"),
    64: ("GPUXidMemory", "gpu-xid-memory"),
    92: ("GPUXidMemory", "gpu-xid-memory"),
    94: ("GPUXidMemory", "gpu-xid-memory"),
    95: ("GPUXidErrorECC", "gpu-ecc-uncorrectable"),
    61: ("GPUXidHang", "gpu-xid-hang"),
    62: ("GPUXidHang", "gpu-xid-hang"),
    79: ("GPUXidError79", "gpu-xid-error"),
    119: ("GPUXidHang", "gpu-xid-hang"),
    120: ("GPUXidHang", "gpu-xid-hang"),
    74: ("GPUXidNVLink", "gpu-xid-nvlink"),
    154: ("GPUXidRecoveryAction", "gpu-xid-recovery-action"),
}
_CODE = re.compile(r"DCGM_FI_DEV_XID_ERRORS == (\d+)")


def rules_for(code: int) -> list[str]:
    return [
        name for name, rule in alert_rules().items() if str(code) in _CODE.findall(rule["expr"])
    ]


def fired(code: int, alertname: str) -> dict[str, str]:
    """The alert's labels as Prometheus sends them for the gauge at ``code``."""
    base: dict[str, str] = am_payload("GPUXidError79-firing-1alerts")["alerts"][0]["labels"]
    labels = {k: v for k, v in base.items() if k not in {"alertname", "severity"}}
    rule: dict[str, Any] = alert_rules()[alertname]
    own = {}
    for key, value in rule["labels"].items():
        if key == "xid":
            own[key] = str(code)
        elif "{{" in value:  # the node: the relabelled `node` the body carries
            own[key] = labels[key]
        else:
            own[key] = value
    return labels | own | {"alertname": alertname}


def test_the_rules_cover_exactly_the_catalogue_codes() -> None:
    codes = {int(c) for rule in alert_rules().values() for c in _CODE.findall(rule["expr"])}
    assert codes == set(CATALOGUE)


@pytest.mark.parametrize("code", sorted(CATALOGUE))
def test_each_xid_code_fires_one_rule_and_reaches_its_playbook(code: int) -> None:
    alertname, expected = CATALOGUE[code]
    assert rules_for(code) == [alertname]
    index = playbooks.PlaybookIndex(shipped_playbooks())
    matched = [p.name for p in index.match(fired(code, alertname))]
    assert matched == [expected]


@pytest.mark.parametrize("name", ["gpu-xid-application", "gpu-xid-burst"])
def test_notify_only_playbooks_take_no_node(name: str) -> None:
    playbook = next(p for p in shipped_playbooks() if p.name == name)
    assert {s.action for s in playbook.steps} == {"notify"}
    assert playbook.exclusive is False


def test_nvlink_never_climbs_the_reset_ladder() -> None:
    playbook = next(p for p in shipped_playbooks() if p.name == "gpu-xid-nvlink")
    actions = {s.action for s in playbook.steps}
    assert actions.isdisjoint({"gpu.ladder", "gpu.reset", "node.reboot", "node.drain"})


@pytest.mark.parametrize("name", ["gpu-xid-memory", "gpu-xid-hang"])
def test_the_node_drain_before_a_reset_waits_for_approval(name: str) -> None:
    playbook = next(p for p in shipped_playbooks() if p.name == name)
    assert playbook.step("drain").requires_approval
    order = [s.action for s in playbook.steps]
    assert order.index("gpu.drain_workloads") < order.index("node.drain")
    assert order.index("node.drain") < order.index("gpu.reset") < order.index("node.reboot")
