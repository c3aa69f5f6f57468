"""``nvidia-smi --query-gpu`` CSV and ``nvidia-smi -q`` for the simulated GPUs."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from remediator.sim.nvidia import Gpu, Host, Result

Field = tuple[str, str, Callable[["Host", "Gpu"], str]]  # header name, unit, value


def _w(value: float) -> str:
    return f"{value:.2f}"


FIELDS: dict[str, Field] = {
    "index": ("index", "", lambda h, g: str(g.index)),
    "count": ("count", "", lambda h, g: str(len(h.gpus))),
    "name": ("name", "", lambda h, g: g.name),
    "serial": ("serial", "", lambda h, g: g.serial),
    "uuid": ("uuid", "", lambda h, g: g.uuid),
    "pci.bus_id": ("pci.bus_id", "", lambda h, g: g.pci_bus_id),
    "gpu_recovery_action": ("gpu_recovery_action", "", lambda h, g: g.recovery_action),
    "driver_version": ("driver_version", "", lambda h, g: h.driver_version),
    "vbios_version": ("vbios_version", "", lambda h, g: g.vbios),
    "persistence_mode": (
        "persistence_mode",
        "",
        lambda h, g: "Enabled" if g.persistence_mode else "Disabled",
    ),
    "temperature.gpu": ("temperature.gpu", "", lambda h, g: str(g.temperature)),
    "temperature.memory": ("temperature.memory", "", lambda h, g: str(g.memory_temperature)),
    "power.draw": ("power.draw", "W", lambda h, g: _w(g.power_draw)),
    "power.limit": ("power.limit", "W", lambda h, g: _w(g.power_limit)),
    "power.default_limit": ("power.default_limit", "W", lambda h, g: _w(g.default_limit)),
    "power.min_limit": ("power.min_limit", "W", lambda h, g: _w(g.min_limit)),
    "power.max_limit": ("power.max_limit", "W", lambda h, g: _w(g.max_limit)),
    "enforced.power.limit": ("enforced.power.limit", "W", lambda h, g: _w(g.enforced_limit)),
    "utilization.gpu": ("utilization.gpu", "%", lambda h, g: str(g.utilization_gpu)),
    "utilization.memory": ("utilization.memory", "%", lambda h, g: str(g.utilization_memory)),
    "memory.used": ("memory.used", "MiB", lambda h, g: str(g.memory_used)),
    "memory.free": ("memory.free", "MiB", lambda h, g: str(g.memory_free)),
    "memory.total": ("memory.total", "MiB", lambda h, g: str(g.memory_total)),
    "memory.reserved": ("memory.reserved", "MiB", lambda h, g: str(g.memory_reserved)),
    "ecc.mode.current": ("ecc.mode.current", "", lambda h, g: g.ecc_mode),
    "ecc.errors.corrected.volatile.total": (
        "ecc.errors.corrected.volatile.total",
        "",
        lambda h, g: str(g.ecc_corrected_volatile),
    ),
    "ecc.errors.uncorrected.volatile.total": (
        "ecc.errors.uncorrected.volatile.total",
        "",
        lambda h, g: str(g.ecc_uncorrected_volatile),
    ),
    "ecc.errors.corrected.aggregate.total": (
        "ecc.errors.corrected.aggregate.total",
        "",
        lambda h, g: str(g.ecc_corrected_aggregate),
    ),
    "ecc.errors.uncorrected.aggregate.total": (
        "ecc.errors.uncorrected.aggregate.total",
        "",
        lambda h, g: str(g.ecc_uncorrected_aggregate),
    ),
    "pstate": ("pstate", "", lambda h, g: g.pstate),
    "clocks.current.sm": ("clocks.current.sm", "MHz", lambda h, g: str(g.clock_sm)),
    "clocks.sm": ("clocks.current.sm", "MHz", lambda h, g: str(g.clock_sm)),
    "clocks.current.memory": ("clocks.current.memory", "MHz", lambda h, g: str(g.clock_memory)),
    "clocks.mem": ("clocks.current.memory", "MHz", lambda h, g: str(g.clock_memory)),
    "mig.mode.current": ("mig.mode.current", "", lambda h, g: "Disabled"),
    "pcie.link.gen.current": ("pcie.link.gen.current", "", lambda h, g: str(g.pcie_gen_current)),
    "pcie.link.gen.max": ("pcie.link.gen.max", "", lambda h, g: str(g.pcie_gen_max)),
    "pcie.link.width.current": (
        "pcie.link.width.current",
        "",
        lambda h, g: str(g.pcie_width_current),
    ),
    "pcie.link.width.max": ("pcie.link.width.max", "", lambda h, g: str(g.pcie_width_max)),
    "clocks_event_reasons.active": (
        "clocks_event_reasons.active",
        "",
        lambda h, g: "0x0000000000000001",
    ),
    "clocks_throttle_reasons.active": (
        "clocks_event_reasons.active",
        "",
        lambda h, g: "0x0000000000000001",
    ),
    "compute_mode": ("compute_mode", "", lambda h, g: "Default"),
}
ALIASES = {
    "gpu_name": "name",
    "gpu_serial": "serial",
    "gpu_uuid": "uuid",
    "gpu_bus_id": "pci.bus_id",
    "persistence-mode": "persistence_mode",
    "enforced.power.limit": "enforced.power.limit",
}


def query_gpu(host: Host, gpus: list[Gpu], fields_arg: str, fmt: str | None) -> Result:
    rc_invalid, rc_lost = 2, 15
    names = [f.strip() for f in fields_arg.split(",") if f.strip()]
    fields: list[Field] = []
    for name in names:
        key = ALIASES.get(name, name)
        if key not in FIELDS:
            return f'Field "{name}" is not a valid field to query.\n\n', "", rc_invalid
        fields.append(FIELDS[key])
    options = {o.strip() for o in (fmt or "").split(",") if o.strip()}
    if "csv" not in options:
        return '"--format" must be specified along with "--query-gpu"\n', "", rc_invalid
    units = "nounits" not in options
    lines: list[str] = []
    if "noheader" not in options:
        lines.append(", ".join(f"{h} [{u}]" if u else h for h, u, _ in fields))
    lost = ""
    for gpu in gpus:
        if gpu.lost:
            lost += gpu.handle_error + "\n"
            continue
        values = []
        for _, unit, get in fields:
            value = get(host, gpu)
            values.append(f"{value} {unit}" if units and unit else value)
        lines.append(", ".join(values))
    out = lost + "".join(line + "\n" for line in lines)
    return out, "", rc_lost if lost else 0


def _kv(depth: int, key: str, value: str | None = None) -> str:
    label = "    " * depth + key
    if value is None:
        return label
    return f"{label:<55}: {value}"


def _gpu_block(gpu: Gpu) -> list[str]:
    bus = gpu.pci_bus_id
    return [
        f"GPU {bus}",
        _kv(1, "Product Name", gpu.name),
        _kv(1, "Product Brand", "NVIDIA"),
        _kv(1, "Product Architecture", "Hopper"),
        _kv(1, "Persistence Mode", "Enabled" if gpu.persistence_mode else "Disabled"),
        _kv(1, "MIG Mode"),
        _kv(2, "Current", "Disabled"),
        _kv(2, "Pending", "Disabled"),
        _kv(1, "Serial Number", gpu.serial),
        _kv(1, "GPU UUID", gpu.uuid),
        _kv(1, "Minor Number", str(gpu.index)),
        _kv(1, "VBIOS Version", gpu.vbios),
        _kv(1, "GPU Recovery Action", gpu.recovery_action),
        _kv(1, "PCI"),
        _kv(2, "Bus", "0x" + bus[9:11]),
        _kv(2, "Device", "0x" + bus[12:14]),
        _kv(2, "Domain", "0x" + bus[4:8]),
        _kv(2, "Bus Id", bus),
        _kv(1, "Fan Speed", "N/A"),
        _kv(1, "Performance State", gpu.pstate),
        _kv(1, "FB Memory Usage"),
        _kv(2, "Total", f"{gpu.memory_total} MiB"),
        _kv(2, "Reserved", f"{gpu.memory_reserved} MiB"),
        _kv(2, "Used", f"{gpu.memory_used} MiB"),
        _kv(2, "Free", f"{gpu.memory_free} MiB"),
        _kv(1, "Compute Mode", "Default"),
        _kv(1, "Utilization"),
        _kv(2, "GPU", f"{gpu.utilization_gpu} %"),
        _kv(2, "Memory", f"{gpu.utilization_memory} %"),
        _kv(1, "ECC Mode"),
        _kv(2, "Current", gpu.ecc_mode),
        _kv(2, "Pending", gpu.ecc_mode),
        _kv(1, "ECC Errors"),
        _kv(2, "Volatile"),
        _kv(3, "DRAM Correctable", str(gpu.ecc_corrected_volatile)),
        _kv(3, "DRAM Uncorrectable", str(gpu.ecc_uncorrected_volatile)),
        _kv(2, "Aggregate"),
        _kv(3, "DRAM Correctable", str(gpu.ecc_corrected_aggregate)),
        _kv(3, "DRAM Uncorrectable", str(gpu.ecc_uncorrected_aggregate)),
        _kv(1, "Remapped Rows"),
        _kv(2, "Correctable Error", str(gpu.remapped_correctable)),
        _kv(2, "Inactive Correctable Error", "0"),
        _kv(2, "Uncorrectable Error", str(gpu.remapped_uncorrectable)),
        _kv(2, "Inactive Uncorrectable Error", "0"),
        _kv(2, "Pending", "Yes" if gpu.remap_pending else "No"),
        _kv(2, "Remapping Failure Occurred", "Yes" if gpu.remap_failure else "No"),
        _kv(1, "Temperature"),
        _kv(2, "GPU Current Temp", f"{gpu.temperature} C"),
        _kv(2, "Memory Current Temp", f"{gpu.memory_temperature} C"),
        _kv(1, "GPU Power Readings"),
        _kv(2, "Average Power Draw", f"{gpu.power_draw:.2f} W"),
        _kv(2, "Instantaneous Power Draw", f"{gpu.power_draw:.2f} W"),
        _kv(2, "Current Power Limit", f"{gpu.enforced_limit:.2f} W"),
        _kv(2, "Requested Power Limit", f"{gpu.power_limit:.2f} W"),
        _kv(2, "Default Power Limit", f"{gpu.default_limit:.2f} W"),
        _kv(2, "Min Power Limit", f"{gpu.min_limit:.2f} W"),
        _kv(2, "Max Power Limit", f"{gpu.max_limit:.2f} W"),
        _kv(1, "Clocks"),
        _kv(2, "SM", f"{gpu.clock_sm} MHz"),
        _kv(2, "Memory", f"{gpu.clock_memory} MHz"),
        _kv(1, "Processes", "None"),
    ]


def query(host: Host, gpus: list[Gpu]) -> Result:
    now = host.clock().astimezone().strftime("%a %b %d %H:%M:%S %Y")
    healthy = [g for g in gpus if not g.lost]
    lost = "".join(g.handle_error + "\n" for g in gpus if g.lost)
    if not healthy:
        return lost, "", 15
    lines = [
        "",
        "==============NVSMI LOG==============",
        "",
        _kv(0, "Timestamp", now),
        _kv(0, "Driver Version", host.driver_version),
        _kv(0, "CUDA Version", host.cuda_version),
        "",
        _kv(0, "Attached GPUs", str(len(host.gpus))),
    ]
    for i, gpu in enumerate(healthy):
        if i:
            lines.append("")
        lines += _gpu_block(gpu)
    return lost + "\n".join(lines) + "\n\n", "", 15 if lost else 0


def _yes(flag: bool) -> str:
    return "Yes" if flag else "No"


APP_FIELDS: dict[str, tuple[str, str, Callable[[Gpu, dict[str, object]], str]]] = {
    "gpu_uuid": ("gpu_uuid", "", lambda g, p: g.uuid),
    "gpu_bus_id": ("gpu_bus_id", "", lambda g, p: g.pci_bus_id),
    "pid": ("pid", "", lambda g, p: str(p["pid"])),
    "process_name": ("process_name", "", lambda g, p: str(p["name"])),
    "name": ("process_name", "", lambda g, p: str(p["name"])),
    "used_gpu_memory": ("used_gpu_memory", "MiB", lambda g, p: str(p.get("used_mib", 0))),
    "used_memory": ("used_gpu_memory", "MiB", lambda g, p: str(p.get("used_mib", 0))),
}
REMAP_FIELDS: dict[str, tuple[str, str, Callable[[Gpu], str]]] = {
    "gpu_bus_id": ("gpu_bus_id", "", lambda g: g.pci_bus_id),
    "gpu_uuid": ("gpu_uuid", "", lambda g: g.uuid),
    "remapped_rows.correctable": (
        "remapped_rows.correctable",
        "",
        lambda g: str(g.remapped_correctable),
    ),
    "remapped_rows.uncorrectable": (
        "remapped_rows.uncorrectable",
        "",
        lambda g: str(g.remapped_uncorrectable),
    ),
    "remapped_rows.pending": ("remapped_rows.pending", "", lambda g: _yes(g.remap_pending)),
    "remapped_rows.failure": ("remapped_rows.failure", "", lambda g: _yes(g.remap_failure)),
}


def _csv_options(fmt: str | None, flag: str) -> set[str] | str:
    options = {o.strip() for o in (fmt or "").split(",") if o.strip()}
    if "csv" not in options:
        return f'"--format" must be specified along with "{flag}"\n'
    return options


def _header(fields: list[tuple[str, str]], options: set[str]) -> list[str]:
    if "noheader" in options:
        return []
    return [", ".join(f"{h} [{u}]" if u else h for h, u in fields)]


def query_compute_apps(gpus: list[Gpu], fields_arg: str, fmt: str | None) -> Result:
    """``--query-compute-apps``: one line per compute process (only the header when none)."""
    names = [f.strip() for f in fields_arg.split(",") if f.strip()]
    unknown = next((n for n in names if n not in APP_FIELDS), None)
    if unknown is not None:
        return f'Field "{unknown}" is not a valid field to query.\n\n', "", 2
    options = _csv_options(fmt, "--query-compute-apps")
    if isinstance(options, str):
        return options, "", 2
    fields = [APP_FIELDS[n] for n in names]
    lines = _header([(h, u) for h, u, _ in fields], options)
    units = "nounits" not in options
    for gpu in gpus:
        for process in [] if gpu.lost else gpu.processes:
            values = [get(gpu, process) for _, _, get in fields]
            units_of = [u for _, u, _ in fields]
            lines.append(
                ", ".join(
                    f"{v} {u}" if units and u else v for v, u in zip(values, units_of, strict=True)
                )
            )
    lost = "".join(g.handle_error + "\n" for g in gpus if g.lost)
    return lost + "".join(line + "\n" for line in lines), "", 15 if lost else 0


def query_remapped_rows(gpus: list[Gpu], fields_arg: str, fmt: str | None) -> Result:
    """``--query-remapped-rows``: one line per GPU, pending and failure as Yes/No."""
    names = [f.strip() for f in fields_arg.split(",") if f.strip()]
    unknown = next((n for n in names if n not in REMAP_FIELDS), None)
    if unknown is not None:
        return f'Field "{unknown}" is not a valid field to query.\n\n', "", 2
    options = _csv_options(fmt, "--query-remapped-rows")
    if isinstance(options, str):
        return options, "", 2
    fields = [REMAP_FIELDS[n] for n in names]
    lines = _header([(h, u) for h, u, _ in fields], options)
    lines += [", ".join(get(g) for _, _, get in fields) for g in gpus if not g.lost]
    lost = "".join(g.handle_error + "\n" for g in gpus if g.lost)
    return lost + "".join(line + "\n" for line in lines), "", 15 if lost else 0
