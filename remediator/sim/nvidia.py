"""Simulated ``nvidia-smi`` over per-GPU state: pure functions returning (stdout, stderr, rc).

Formats, messages and exit codes follow real captures from an H200 (driver 580.159.04) in
``tests/fixtures/nvidia-smi/h200``. Exit codes: 0 ok, 2 invalid argument, 6 not found,
15 GPU has fallen off the bus.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable

from remediator.sim import nvidia_query

RC_OK = 0
RC_INVALID = 2
RC_NOT_FOUND = 6
RC_GPU_LOST = 15

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
    error: str | None = None


_VALUE_OPTS = {
    "-i": "ids",
    "--id": "ids",
    "--query-gpu": "query_gpu",
    "--format": "fmt",
    "-pl": "power_limit",
    "--power-limit": "power_limit",
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
