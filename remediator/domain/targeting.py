"""Which Node an alert is about: candidates from its labels, and the choice among them.

An alert names its node in different labels depending on how the exporter was deployed and
scraped: a ``node`` the scrape relabelled, the GPU Operator's ``kubernetes_node``, dcgm-exporter's
``Hostname`` (the node with the node-name setting or host networking, else the exporter *pod's*
name), or ``instance`` (``host:port``: the node, or the exporter pod's IP). Taking the first
non-empty label acts on whatever it holds; a pod name there made every node-level run fail and
an IP could name nobody. So every label of the configured order yields a *candidate*, and a
candidate counts only once the cluster confirms it (``engine.targeting`` asks):

1. the value (port stripped) is the name of an existing Node → that Node;
2. the value is an IP → the pods with that ``status.podIP`` (the exporter's own pod, or every
   host-network pod of one node) → their ``spec.nodeName`` when they all agree;
3. otherwise, the value is a pod in the alert's namespace (``namespace``; ``exported_namespace``
   for ``exported_*`` labels) → its ``spec.nodeName`` (dcgm-exporter's ``Hostname`` = its pod).

The first confirmed candidate of the order wins. When none is confirmed the run fails with every
candidate and why it was refused: a clear reason on record and a notification, never a guess.

Pure: what the cluster said arrives as ``Finding`` values; no I/O here.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Iterable, Mapping, Sequence

from remediator.domain import matching

#: The global default order (setting ``target_node_labels``; a playbook's ``target.node_labels``
#: overrides it). Labels that name the node by construction come before those that may hold a
#: pod name or IP.
DEFAULT_ORDER = ("node", "kubernetes_node", "Hostname", "hostname", "instance")


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One label's claim: ``host`` is the value without a ``:port``; ``namespace`` is where a
    pod of that name would live (the alert's namespace label), if the alert has one."""

    label: str
    value: str
    host: str
    namespace: str | None = None

    @property
    def ip(self) -> str | None:
        try:
            return str(ipaddress.ip_address(self.host))
        except ValueError:
            return None

    def __str__(self) -> str:
        return f"{self.label}={self.value}"


@dataclasses.dataclass(frozen=True)
class Finding:
    """What the cluster says about one candidate: the node it leads to, or why none."""

    node: str | None
    detail: str


@dataclasses.dataclass(frozen=True)
class Choice:
    node: str | None
    reason: str
    """For a chosen node: which label and how (``kubernetes_node=gpu-node-01 is a Node``);
    without one: every candidate and why it was refused."""


def candidates(labels: Mapping[str, str], order: Iterable[str]) -> list[Candidate]:
    """The non-empty labels of ``order``, in order, one candidate per distinct host."""
    found: list[Candidate] = []
    seen: set[str] = set()
    for label in order:
        value = labels.get(label, "")  # as given: "node\n" is no node name, never "node"
        if not value:
            continue
        host = matching.strip_port(value)
        if not host or host in seen:
            continue
        seen.add(host)
        namespace_label = "exported_namespace" if label.startswith("exported_") else "namespace"
        namespace = labels.get(namespace_label) or None
        found.append(Candidate(label=label, value=value, host=host, namespace=namespace))
    return found


def choose(
    order: Sequence[str],
    found: Sequence[tuple[Candidate, Finding]],
) -> Choice:
    """The first candidate the cluster confirmed, else a failure naming them all."""
    for candidate, finding in found:
        if finding.node:
            return Choice(node=finding.node, reason=f"{candidate}: {finding.detail}")
    looked = ", ".join(order)
    if not found:
        return Choice(node=None, reason=f"no node label found (looked at {looked})")
    refused = "; ".join(f"{candidate}: {finding.detail}" for candidate, finding in found)
    return Choice(node=None, reason=f"no candidate is a Node (looked at {looked}): {refused}")


def unverified(labels: Mapping[str, str], order: Sequence[str]) -> Choice:
    """Without a cluster to ask (dry runs without Kubernetes, tests): the first non-empty
    label, unconfirmed, as before targeting asked the cluster."""
    node = matching.first_label(labels, order)
    if node is None:
        return Choice(node=None, reason=f"no node label found (looked at {', '.join(order)})")
    return Choice(node=node, reason="taken from the labels without asking the cluster")
