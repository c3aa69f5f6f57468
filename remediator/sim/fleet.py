"""Fleet descriptions (YAML, validated with pydantic) and seeding them into a cluster."""

from __future__ import annotations

import importlib.resources
import pathlib
import uuid
import zlib
from typing import Any, Literal

import pydantic

from remediator.sim import nvidia

GPU_MODELS: dict[str, dict[str, Any]] = {
    "H100": {
        "name": "NVIDIA H100 80GB HBM3",
        "memory_total": 81559,
        "min_limit": 200.0,
        "max_limit": 700.0,
        "default_limit": 700.0,
        "clock_memory": 2619,
    },
    "H200": {
        "name": "NVIDIA H200",
        "memory_total": 143771,
        "min_limit": 200.0,
        "max_limit": 700.0,
        "default_limit": 700.0,
        "clock_memory": 3201,
    },
    "A100": {
        "name": "NVIDIA A100-SXM4-80GB",
        "memory_total": 81920,
        "min_limit": 100.0,
        "max_limit": 400.0,
        "default_limit": 400.0,
        "clock_memory": 1593,
    },
}


class _Model(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")


class Settings(_Model):
    time_scale: float = pydantic.Field(1.0, gt=0)
    """Real seconds per simulated second (0.01 makes a 30 s grace period last 0.3 s)."""
    default_grace_seconds: int | None = None
    """Overrides terminationGracePeriodSeconds of every pod when set."""
    pod_startup_seconds: float = 1.0
    bug_report_seconds: float = 3.0
    reboot_seconds: float = 60.0
    """How long a rebooting host stays down (its node NotReady) before it is back."""
    driver_version: str = "535.129.03"
    cuda_version: str = "12.2"


class GpuOverride(_Model):
    index: int
    uuid: str | None = None
    pci_bus_id: str | None = None
    temperature: int | None = None
    power_draw: float | None = None
    power_limit: float | None = None
    utilization_gpu: int | None = None
    memory_used: int | None = None
    ecc_uncorrected_volatile: int | None = None
    lost: bool | None = None


class GpuSet(_Model):
    model: str = "H100"
    count: int = 8
    min_limit: float | None = None
    max_limit: float | None = None
    default_limit: float | None = None
    overrides: list[GpuOverride] = []


class Taint(_Model):
    key: str
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class Node(_Model):
    name: str
    labels: dict[str, str] = {}
    taints: list[Taint] = []
    allocatable: dict[str, str] = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    unschedulable: bool = False
    gpus: GpuSet | None = None
    bug_report_hangs: bool = False


class Container(_Model):
    name: str
    image: str = "registry.example.com/app:latest"
    gpus: int = 0


class Workload(_Model):
    kind: Literal["StatefulSet", "ReplicaSet", "Deployment", "DaemonSet", "Pod", "MirrorPod"]
    name: str
    namespace: str = "default"
    replicas: int = 1
    labels: dict[str, str] = {}
    containers: list[Container]
    nodes: list[str] = []
    """Initial placement of replicas (one entry per replica); the rest are scheduled."""
    pod_names: list[str] = []
    """Initial pod names for ReplicaSets/Deployments/DaemonSets (default: random suffix)."""
    node_selector: dict[str, str] = {}
    tolerations: list[dict[str, Any]] = []
    empty_dir: bool = False
    grace_seconds: int = 30
    host_network: bool = False
    """Pods share the node's network namespace: their podIP is the node's InternalIP."""
    gpu_indexes: list[list[int]] = []
    """Per initially placed replica, the GPU indexes the kubelet gave it (default: the lowest
    free ones when first asked)."""


class Pdb(_Model):
    name: str
    namespace: str = "default"
    match_labels: dict[str, str]
    min_available: int | str | None = None
    max_unavailable: int | str | None = None


class Fleet(_Model):
    settings: Settings = Settings()
    namespaces: list[str] = []
    nodes: list[Node]
    workloads: list[Workload] = []
    pdbs: list[Pdb] = []

    @classmethod
    def from_yaml(cls, text: str) -> Fleet:
        import yaml

        return cls.model_validate(yaml.safe_load(text))

    @classmethod
    def from_file(cls, path: str | pathlib.Path) -> Fleet:
        return cls.from_yaml(pathlib.Path(path).read_text(encoding="utf-8"))

    @classmethod
    def default(cls) -> Fleet:
        text = importlib.resources.files("remediator.sim").joinpath("fleets/default.yaml")
        return cls.from_yaml(text.read_text(encoding="utf-8"))


def gpu_uuid(node: str, index: int) -> str:
    raw = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}/gpu/{index}"))
    return f"GPU-{raw}"


def pci_bus_id(index: int) -> str:
    return f"00000000:{0x18 + 0x10 * index:02X}:00.0"


def build_host(node: Node, settings: Settings) -> nvidia.Host | None:
    if node.gpus is None:
        return None
    model = dict(GPU_MODELS.get(node.gpus.model, GPU_MODELS["H100"]))
    for key in ("min_limit", "max_limit", "default_limit"):
        value = getattr(node.gpus, key)
        if value is not None:
            model[key] = value
    overrides = {o.index: o for o in node.gpus.overrides}
    gpus = []
    for index in range(node.gpus.count):
        gpu = nvidia.Gpu(
            index=index,
            uuid=gpu_uuid(node.name, index),
            pci_bus_id=pci_bus_id(index),
            serial=f"16{zlib.crc32(f'{node.name}/{index}'.encode()):011d}",
            power_limit=model["default_limit"],
            **model,
        )
        override = overrides.get(index)
        if override is not None:
            for key, value in override.model_dump(exclude_none=True).items():
                setattr(gpu, key, value)
        gpus.append(gpu)
    return nvidia.Host(
        gpus=gpus,
        driver_version=settings.driver_version,
        cuda_version=settings.cuda_version,
        bug_report_hangs=node.bug_report_hangs,
    )


GENERATED_GPU_LABELS = {
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/mig.strategy": "single",
    "node-role.kubernetes.io/gpu": "",
}


def generated_node_name(index: int, nodes: int) -> str:
    """Name of the ``index``-th (from 1) of ``nodes`` generated nodes: ``gpu-node-0001``."""
    return f"gpu-node-{index:0{max(4, len(str(nodes)))}d}"


def generate(nodes: int) -> Fleet:
    """A fleet of ``nodes`` H100 nodes (eight GPUs each, the GPU taint, GPU feature discovery's
    labels) carrying the GPU Operator's driver and DCGM exporter pods, one of each per node.

    Settings and the two daemonsets are the default fleet's, so a generated fleet answers
    nvidia-smi and dcgmi in every driver pod exactly as the default fleet does.
    """
    if nodes < 1:
        raise ValueError("a generated fleet needs at least one node")
    default = Fleet.default()
    names = [generated_node_name(index, nodes) for index in range(1, nodes + 1)]
    # Pod names from the node's number: random five-letter suffixes collide in a large fleet.
    daemonsets = [
        w.model_copy(
            update={
                "nodes": names,
                "pod_names": [f"{w.name}-{name.rsplit('-', 1)[1]}" for name in names],
            }
        )
        for w in default.workloads
        if w.kind == "DaemonSet"
    ]
    gpu_nodes = [
        Node(
            name=name,
            labels=dict(GENERATED_GPU_LABELS),
            taints=[Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule")],
            allocatable={"cpu": "192", "memory": "2Ti", "pods": "110"},
            gpus=GpuSet(model="H100", count=8),
        )
        for name in names
    ]
    return Fleet(
        settings=default.settings,
        namespaces=sorted({w.namespace for w in daemonsets}),
        nodes=gpu_nodes,
        workloads=daemonsets,
    )
