"""The demo scenario as data: acts of real Alertmanager deliveries, what the simulated hardware
does meanwhile, which steps the demo operator approves, and the facts about the cluster that
must hold when each act ends.

The delivery bodies in ``scenario/`` are the exact bytes Alertmanager 0.25 sent (copies of
``tests/fixtures/alertmanager-0.25``); their nodes, GPUs and pods exist in the simulator's
default fleet.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
from typing import Any

HOT_NODE = "gpu-node-01"
ECC_NODE = "gpu-node-02"
XID_NODE = "gpu-node-03"
IDLE_POD = ("inference", "vllm-llama3-70b-7c9d5")
UNDERUTILIZED = "remediator.io/gpu-underutilized"
FAULTY_TAINT = "nvidia.com/gpu-unhealthy"


@dataclasses.dataclass(frozen=True)
class Hardware:
    """What the simulated GPU does before the alert arrives (what DCGM measured)."""

    node: str
    gpu: int
    state: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class PowerLimit:
    node: str
    gpu: int
    percent_of_default: float

    def describe(self) -> str:
        level = (
            "its default"
            if self.percent_of_default == 100
            else f"{self.percent_of_default:g}% of default"
        )
        return f"{self.node} GPU {self.gpu} power limit at {level}"


@dataclasses.dataclass(frozen=True)
class Cordoned:
    node: str

    def describe(self) -> str:
        return f"{self.node} cordoned (unschedulable)"


@dataclasses.dataclass(frozen=True)
class NodeLabel:
    node: str
    key: str
    value: str

    def describe(self) -> str:
        return f"{self.node} labelled {self.key}={self.value}"


@dataclasses.dataclass(frozen=True)
class NodeTaint:
    node: str
    key: str
    effect: str

    def describe(self) -> str:
        return f"{self.node} tainted {self.key}:{self.effect}"


@dataclasses.dataclass(frozen=True)
class OnlyDaemonSetPods:
    node: str

    def describe(self) -> str:
        return f"{self.node} runs only DaemonSet pods (workloads drained)"


@dataclasses.dataclass(frozen=True)
class PodAnnotation:
    namespace: str
    pod: str
    key: str
    present: bool

    def describe(self) -> str:
        verb = "carries" if self.present else "no longer carries"
        return f"pod {self.namespace}/{self.pod} {verb} annotation {self.key}"


@dataclasses.dataclass(frozen=True)
class BugReport:
    playbook: str
    node: str
    safe_mode: bool

    def describe(self) -> str:
        mode = " (--safe-mode)" if self.safe_mode else ""
        return f"nvidia-bug-report{mode} of {self.node} stored, SHA-256 matches"


Expectation = (
    PowerLimit | Cordoned | NodeLabel | NodeTaint | OnlyDaemonSetPods | PodAnnotation | BugReport
)


@dataclasses.dataclass(frozen=True)
class Act:
    title: str
    story: str
    deliveries: tuple[str, ...]
    new_runs: dict[str, int] = dataclasses.field(default_factory=dict)
    """Runs the deliveries must start, by playbook."""
    hardware: tuple[Hardware, ...] = ()
    approve: tuple[str, ...] = ()
    """Step keys the demo operator approves when they wait."""
    expect: tuple[Expectation, ...] = ()


def _drained(node: str, playbook: str, *, safe_mode: bool) -> tuple[Expectation, ...]:
    return (
        Cordoned(node),
        NodeLabel(node, "gpu-status", "faulty"),
        NodeTaint(node, FAULTY_TAINT, "NoSchedule"),
        OnlyDaemonSetPods(node),
        BugReport(playbook, node, safe_mode=safe_mode),
    )


SCENARIO: tuple[Act, ...] = (
    Act(
        title="Overheating",
        story="GPUs 0 and 1 of gpu-node-01 run above 85°C; Alertmanager groups both alerts "
        "into one delivery. Each GPU gets its own run and its own power cap.",
        hardware=(
            Hardware(HOT_NODE, 0, {"temperature": 88}),
            Hardware(HOT_NODE, 1, {"temperature": 87}),
        ),
        deliveries=("GPUTemperatureHigh-firing-2alerts.json",),
        new_runs={"gpu-temperature-high": 2},
        expect=(PowerLimit(HOT_NODE, 0, 70), PowerLimit(HOT_NODE, 1, 70)),
    ),
    Act(
        title="GPU 1 cools down",
        story="The next delivery of the group says GPU 1 resolved while GPU 0 still fires: "
        "only GPU 1's previous limit is restored (on_resolve: undo).",
        hardware=(Hardware(HOT_NODE, 1, {"temperature": 62}),),
        deliveries=("GPUTemperatureHigh-firing-partial-2alerts.json",),
        expect=(PowerLimit(HOT_NODE, 0, 70), PowerLimit(HOT_NODE, 1, 100)),
    ),
    Act(
        title="Low utilization",
        story="GPU 2 of gpu-node-02 idles below 30% under a vLLM pod: the pod is annotated "
        "and its owner notified.",
        hardware=(Hardware(ECC_NODE, 2, {"utilization_gpu": 5}),),
        deliveries=("GPUUtilizationLow-firing-1alerts.json",),
        new_runs={"gpu-utilization-low": 1},
        expect=(PodAnnotation(*IDLE_POD, UNDERUTILIZED, present=True),),
    ),
    Act(
        title="Utilization recovers",
        story="The alert resolves: the annotation is removed again.",
        hardware=(Hardware(ECC_NODE, 2, {"utilization_gpu": 91}),),
        deliveries=("GPUUtilizationLow-resolved-1alerts.json",),
        expect=(PodAnnotation(*IDLE_POD, UNDERUTILIZED, present=False),),
    ),
    Act(
        title="Uncorrectable ECC error",
        story="GPU 5 of gpu-node-02 returns memory it cannot correct. On-call is told first "
        "(what happened, what comes next, what needs approval); then the node is cordoned, "
        "labelled and tainted, and the drain waits for an operator.",
        hardware=(
            Hardware(ECC_NODE, 5, {"ecc_uncorrected_volatile": 2, "ecc_uncorrected_aggregate": 2}),
        ),
        deliveries=("GPUECCUncorrectableError-firing-1alerts.json",),
        new_runs={"gpu-ecc-uncorrectable": 1},
        approve=("drain",),
        expect=_drained(ECC_NODE, "gpu-ecc-uncorrectable", safe_mode=False),
    ),
    Act(
        title="Xid 79: a GPU falls off the bus",
        story="GPU 3 of gpu-node-03 is lost (nvidia-smi exits 15). Same procedure; the bug "
        "report runs in --safe-mode because a full one would hang on the lost GPU.",
        hardware=(Hardware(XID_NODE, 3, {"lost": True}),),
        deliveries=("GPUXidError79-firing-1alerts.json", "GPUXidError79-firing-1alerts.json"),
        new_runs={"gpu-xid-error": 1},
        approve=("drain",),
        expect=_drained(XID_NODE, "gpu-xid-error", safe_mode=True),
    ),
    Act(
        title="Resolutions",
        story="GPU 0 cools down and its limit is restored. The ECC and Xid alerts resolve "
        "too, but those nodes stay out of service (on_resolve: continue) until someone runs "
        "the return-node-to-service runbook.",
        hardware=(Hardware(HOT_NODE, 0, {"temperature": 58}),),
        deliveries=(
            "GPUTemperatureHigh-resolved-1alerts.json",
            "GPUECCUncorrectableError-resolved-1alerts.json",
            "GPUXidError79-resolved-1alerts.json",
        ),
        expect=(
            PowerLimit(HOT_NODE, 0, 100),
            PowerLimit(HOT_NODE, 1, 100),
            Cordoned(ECC_NODE),
            Cordoned(XID_NODE),
        ),
    ),
)


def delivery_body(name: str) -> bytes:
    """The exact bytes Alertmanager sent, shipped with the package."""
    return importlib.resources.files("remediator.demo").joinpath("scenario", name).read_bytes()
