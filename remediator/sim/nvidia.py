"""Simulated ``nvidia-smi`` over per-GPU state: pure functions returning (stdout, stderr, rc).

Formats, messages and exit codes follow real captures from an H200 (driver 580.159.04) in
``tests/fixtures/nvidia-smi/h200``. Exit codes: 0 ok, 2 invalid argument, 6 not found,
15 GPU has fallen off the bus, 255 other (a reset refused because a process uses the GPU).

A GPU reset (``-r``) and a host reboot clear what the driver keeps in memory: volatile ECC
counters, a pending row remap (applied: the remapped-row counts stay), compute processes,
power limits. Aggregate counters and a row-remap failure persist: they live in the GPU's
InfoROM.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable
from typing import Any

from remediator.sim import nvidia_query

RC_OK = 0
RC_INVALID = 2
RC_NOT_FOUND = 6
RC_GPU_LOST = 15
RC_OTHER = 255

Result = tuple[str, str, int]


@dataclasses.dataclass
class Gpu:
    index: int
    uuid: str
    pci_bus_id: str
    name: str = "NVIDIA H100 80GB HBM3"
    serial: str = "1650000000000"
    vbios: str = "96.00.99.00.01"
    persistence_mode: bool = True
    temperature: int = 35
    memory_temperature: int = 33
    power_draw: float = 120.0
    power_limit: float = 700.0
    default_limit: float = 700.0
    min_limit: float = 200.0
    max_limit: float = 700.0
    utilization_gpu: int = 0
    utilization_memory: int = 0
    memory_total: int = 81559
    memory_reserved: int = 616
    memory_used: int = 0
    ecc_mode: str = "Enabled"
    ecc_corrected_volatile: int = 0
    ecc_uncorrected_volatile: int = 0
    ecc_corrected_aggregate: int = 0
    ecc_uncorrected_aggregate: int = 0
    pstate: str = "P0"
    clock_sm: int = 1980
    clock_memory: int = 2619
    lost: bool = False
    processes: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Compute processes: ``{"pid": int, "name": str, "used_mib": int}``."""
    remapped_correctable: int = 0
    remapped_uncorrectable: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    pcie_gen_current: int = 5
    pcie_gen_max: int = 5
    pcie_width_current: int = 16
    pcie_width_max: int = 16
    recovery_action: str = "None"
    """What the driver recommends after Xid 154 ("GPU Recovery Action" in ``nvidia-smi -q``):
    None, GPU Reset, Node Reboot, Drain P2P or Drain and Reset; a reset or reboot clears it."""
    diag_failures: list[str] = dataclasses.field(default_factory=list)
    """DCGM diagnostic tests this GPU fails (``dcgmi diag``), e.g. ``["Memory"]``: hardware
    faults, so neither a reset nor a reboot clears them (see ``dcgm``)."""

    def clear_volatile(self) -> None:
        """What a GPU reset or a reboot clears (the GPU answers again after either)."""
        self.lost = False
        self.processes = []
        self.ecc_corrected_volatile = 0
        self.ecc_uncorrected_volatile = 0
        self.remap_pending = False
        self.recovery_action = "None"
        self.power_limit = self.default_limit
        self.memory_used = 0
        self.utilization_gpu = 0

    @property
    def memory_free(self) -> int:
        return max(0, self.memory_total - self.memory_reserved - self.memory_used)

    @property
    def enforced_limit(self) -> float:
        return min(self.power_limit, self.max_limit)

    @property
    def handle_error(self) -> str:
        # exit code 15 is NVML_ERROR_GPU_IS_LOST, whose nvmlErrorString this is
        return (
            f"Unable to determine the device handle for GPU{self.pci_bus_id[4:]}: GPU is lost.  "
            "Reboot the system to recover this GPU"
        )


@dataclasses.dataclass
class Host:
    """What ``nvidia-smi`` sees on one node."""

    gpus: list[Gpu]
    driver_version: str = "580.159.04"
    cuda_version: str = "13.0"
    bug_report_hangs: bool = False
    clock: Callable[[], datetime.datetime] = dataclasses.field(
        default=lambda: datetime.datetime.now(datetime.UTC)
    )

    def reboot(self) -> None:
        for gpu in self.gpus:
            gpu.clear_volatile()


def select(host: Host, ids: str | None) -> list[Gpu] | None:
    """The GPUs ``-i``/``--id`` names (all without it); ``None`` when one is not found."""
    if ids is None:
        return list(host.gpus)
    chosen: list[Gpu] = []
    for ident in (i.strip() for i in ids.split(",")):
        gpu = _find(host, ident)
        if gpu is None:
            return None
        chosen.append(gpu)
    return chosen


def _find(host: Host, ident: str) -> Gpu | None:
    for gpu in host.gpus:
        if ident.isdigit() and int(ident) == gpu.index:
            return gpu
        if ident.lower() == gpu.uuid.lower():
            return gpu
        bus = gpu.pci_bus_id.lower()
        if ident.lower() in (bus, bus[4:], bus[9:]):
            return gpu
    return None


@dataclasses.dataclass
class Args:
    ids: str | None = None
    list_gpus: bool = False
    query: bool = False
    query_gpu: str | None = None
    fmt: str | None = None
    power_limit: str | None = None
    query_compute_apps: str | None = None
    query_remapped_rows: str | None = None
    reset: bool = False
    error: str | None = None


_VALUE_OPTS = {
    "-i": "ids",
    "--id": "ids",
    "--query-gpu": "query_gpu",
    "--format": "fmt",
    "-pl": "power_limit",
    "--power-limit": "power_limit",
    "--query-compute-apps": "query_compute_apps",
    "--query-remapped-rows": "query_remapped_rows",
    "-d": "",
    "--display": "",
}


def parse_args(argv: list[str]) -> Args:
    args = Args()
    items = list(argv)
    while items:
        item = items.pop(0)
        name, eq, inline = item.partition("=")
        if name in _VALUE_OPTS:
            value = inline if eq else (items.pop(0) if items else None)
            if value is None:
                args.error = f'Option "{name}" is missing a value.'
                return args
            if _VALUE_OPTS[name]:
                setattr(args, _VALUE_OPTS[name], value)
        elif item in ("-L", "--list-gpus"):
            args.list_gpus = True
        elif item in ("-q", "--query"):
            args.query = True
        elif item in ("-r", "--gpu-reset"):
            args.reset = True
        else:
            args.error = (
                'Invalid combination of input arguments. Please run "nvidia-smi -h" for help.'
            )
            return args
    return args


def run(host: Host, argv: list[str]) -> Result:
    args = parse_args(argv)
    if args.error:
        return "", args.error + "\n", RC_INVALID
    gpus = select(host, args.ids)
    if not gpus:
        return "No devices were found\n", "", RC_NOT_FOUND
    if args.power_limit is not None:
        return set_power_limit(gpus, args.power_limit)
    if args.reset:
        return reset(gpus)
    if args.query_compute_apps is not None:
        return nvidia_query.query_compute_apps(gpus, args.query_compute_apps, args.fmt)
    if args.query_remapped_rows is not None:
        return nvidia_query.query_remapped_rows(gpus, args.query_remapped_rows, args.fmt)
    if args.query_gpu is not None:
        return nvidia_query.query_gpu(host, gpus, args.query_gpu, args.fmt)
    if args.list_gpus:
        return list_gpus(gpus)
    if args.query:
        return nvidia_query.query(host, gpus)
    return table(host, gpus)


def _lost_lines(gpus: list[Gpu]) -> str:
    return "".join(g.handle_error + "\n" for g in gpus if g.lost)


def list_gpus(gpus: list[Gpu]) -> Result:
    out = "".join(
        g.handle_error + "\n" if g.lost else f"GPU {g.index}: {g.name} (UUID: {g.uuid})\n"
        for g in gpus
    )
    return out, "", RC_GPU_LOST if any(g.lost for g in gpus) else RC_OK


def set_power_limit(gpus: list[Gpu], raw: str) -> Result:
    try:
        watts = float(raw)
    except ValueError:
        return "", f'Invalid value "{raw}" for power limit.\n', RC_INVALID
    if any(g.lost for g in gpus):
        return _lost_lines(gpus), "", RC_GPU_LOST
    out = ""
    for gpu in gpus:
        if not gpu.min_limit <= watts <= gpu.max_limit:
            out += (
                f"Provided power limit {watts:.2f} W is not a valid power limit which should "
                f"be between {gpu.min_limit:.2f} W and {gpu.max_limit:.2f} W for GPU "
                f"{gpu.pci_bus_id}\n"
            )
            return out + "Terminating early due to previous errors.\n", "", RC_INVALID
    for gpu in gpus:
        previous = gpu.power_limit
        gpu.power_limit = watts
        gpu.power_draw = min(gpu.power_draw, watts)
        out += (
            f"Power limit for GPU {gpu.pci_bus_id} was set to {watts:.2f} W from "
            f"{previous:.2f} W.\n"
        )
    return out + "All done.\n", "", RC_OK


IN_USE_HINT = (
    "1 device is currently being used by one or more other processes (e.g., Fabric Manager, "
    "CUDA application, graphics application such as an X server, or a monitoring application "
    "such as another instance of nvidia-smi). Please first kill all processes using this "
    "device and all compute applications running in the system.\n"
)


def reset(gpus: list[Gpu]) -> Result:
    """``-r``: refused for a GPU that is lost or in use; otherwise clears its volatile state."""
    if any(g.lost for g in gpus):
        return _lost_lines(gpus), "", RC_GPU_LOST
    busy = [g for g in gpus if g.processes]
    if busy:
        out = "".join(f"GPU {g.pci_bus_id} is currently in use by another process.\n" for g in busy)
        return out + "\n" + IN_USE_HINT, "", RC_OTHER
    out = ""
    for gpu in gpus:
        gpu.clear_volatile()
        out += f"GPU {gpu.pci_bus_id} was successfully reset.\n"
    return out + "All done.\n", "", RC_OK


_RULE = (
    "+-----------------------------------------+------------------------+----------------------+"
)
_WIDE = "+" + "-" * 89 + "+"
_HEAD = [
    "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
    "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
    "|                                         |                        |               MIG M. |",
    "|=========================================+========================+======================|",
]
_PROCESSES = [
    _WIDE,
    "| Processes:" + " " * 78 + "|",
    "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
    "|        ID   ID                                                               Usage      |",
    "|" + "=" * 89 + "|",
    "|  No running processes found" + " " * 61 + "|",
    _WIDE,
]


def _gpu_rows(gpu: Gpu) -> list[str]:
    persist = "On" if gpu.persistence_mode else "Off"
    ecc = str(gpu.ecc_uncorrected_volatile) if gpu.ecc_mode == "Enabled" else "N/A"
    name = gpu.name if len(gpu.name) <= 29 else gpu.name[:26] + "..."
    power = f"{round(gpu.power_draw)}W / {round(gpu.power_limit):>4}W"
    return [
        f"|{gpu.index:>4}  {name:<29}{persist:>4}  | {gpu.pci_bus_id:>18} Off |{ecc:>21} |",
        f"| N/A  {gpu.temperature:>3}C    {gpu.pstate:<2}{power:>24} |"
        f"{gpu.memory_used:>8}MiB / {gpu.memory_total:>6}MiB |"
        f"{gpu.utilization_gpu:>7}%{'Default':>13} |",
        f"|{'':41}|{'':24}|{'Disabled':>21} |",
        _RULE,
    ]


def table(host: Host, gpus: list[Gpu]) -> Result:
    now = host.clock().astimezone()
    lines = [now.strftime("%a %b %d %H:%M:%S %Y") + "       ", _WIDE]
    header = (
        f"| NVIDIA-SMI {host.driver_version:<22} Driver Version: {host.driver_version:<14} "
        f"CUDA Version: {host.cuda_version:<9}|"
    )
    lines += [header, _RULE, *_HEAD]
    errors = _lost_lines(gpus)
    healthy = [g for g in gpus if not g.lost]
    if not healthy:
        return errors, "", RC_GPU_LOST
    for gpu in healthy:
        lines += _gpu_rows(gpu)
    lines += ["", *_PROCESSES]
    out = errors + "\n".join(lines) + "\n"
    return out, "", RC_GPU_LOST if errors else RC_OK
