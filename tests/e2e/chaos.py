"""The chaos test's world and actors.

- ``SimProcess``: ``remediator sim`` as a child process on a fixed port, restartable with its
  state file (the cluster carries on) or without it (the cluster starts over from the fleet).
- ``make_plan``: everything random about a storm, drawn from one seed: alert episodes built from
  the captured Alertmanager 0.25 bodies (other nodes, GPUs and start times), their repeats and
  resolutions, how long the server lives between SIGKILLs, when the simulator restarts. The
  plan is the same for the same seed; only the timing of real processes varies between runs.
- Actors, each a thread: ``Alertmanager`` (delivers in order per alert and retries until it gets
  a 200, as Alertmanager does), ``Monkey`` (SIGKILLs and restarts the server, restarts the
  simulator once) and ``Operator`` (approves, or now and then rejects, waiting steps through
  the API, as on-call would).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import hashlib
import json
import pathlib
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import yaml

from remediator.demo.processes import free_port
from remediator.sim import fleet as sim_fleet
from tests.conftest import ROOT, am_payload
from tests.e2e.procs import Serve

THERMAL_NODES = ("gpu-node-01", "gpu-node-02", "gpu-node-03")
"""Where GPUTemperatureCritical fires (its playbook cordons, drains and undoes on resolve)."""
HARDWARE_NODES = ("gpu-node-04", "gpu-node-05", "gpu-node-06")
"""Where Xid 79 and ECC errors fire (their playbooks take the node out and never undo)."""
GPU_NODES = THERMAL_NODES + HARDWARE_NODES
GPUS_PER_NODE = 8
TEMPLATES = {
    "GPUTemperatureHigh": "GPUTemperatureHigh-firing-2alerts",
    "GPUTemperatureCritical": "GPUTemperatureCritical-firing-1alerts",
    "GPUXidError79": "GPUXidError79-firing-1alerts",
    "GPUECCUncorrectableError": "GPUECCUncorrectableError-firing-1alerts",
}
EPISODES = {
    "GPUTemperatureHigh": 28,
    "GPUTemperatureCritical": 10,
    "GPUXidError79": 5,
    "GPUECCUncorrectableError": 5,
}
ALWAYS_RESOLVED = ("GPUTemperatureHigh", "GPUTemperatureCritical")
ORIGIN = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)
TIME_SCALE = 0.05
"""Simulated seconds run 20x faster: a 30 s grace period lasts 1.5 s."""


def fault_rules(seed: int) -> dict[str, Any]:
    """About one Kubernetes API request in five fails (429 with Retry-After, 500, 503) and one
    exec stream in five is dropped, half before its command runs and half after."""
    return {
        "seed": seed,
        "rules": [
            {
                "path_prefix": "/api",
                "rate_429": 0.07,
                "retry_after_seconds": 1,
                "rate_500": 0.07,
                "rate_503": 0.07,
                "drop_websocket_rate": 0.1,
                "drop_websocket_after_rate": 0.1,
            }
        ],
    }


def fleet_description() -> dict[str, Any]:
    """Six H100 nodes running the GPU Operator's driver, six one-GPU trainers (managed, with
    scratch space, no disruption budget) and one bare notebook pod that a drain refuses."""
    labels = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": str(GPUS_PER_NODE),
    }
    nodes: list[dict[str, Any]] = [
        {
            "name": name,
            "labels": labels,
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
            "gpus": {"model": "H100", "count": GPUS_PER_NODE},
        }
        for name in GPU_NODES
    ]
    nodes.append({"name": "cpu-node-01", "labels": {"node-role.kubernetes.io/worker": ""}})
    driver_labels = {
        "app": "nvidia-driver-daemonset",
        "app.kubernetes.io/component": "nvidia-driver",
    }
    description = {
        "settings": {"pod_startup_seconds": 2, "bug_report_seconds": 5},
        "namespaces": ["gpu-operator", "ml-training", "research"],
        "nodes": nodes,
        "workloads": [
            {
                "kind": "DaemonSet",
                "name": "nvidia-driver-daemonset",
                "namespace": "gpu-operator",
                "labels": driver_labels,
                "node_selector": {"nvidia.com/gpu.present": "true"},
                "containers": [{"name": "nvidia-driver-ctr"}],
            },
            {
                "kind": "Deployment",
                "name": "trainer",
                "namespace": "ml-training",
                "replicas": len(GPU_NODES),
                "labels": {"app": "trainer"},
                "nodes": list(GPU_NODES),
                "empty_dir": True,
                "containers": [{"name": "trainer", "gpus": 1}],
            },
            {
                "kind": "Pod",
                "name": "jupyter-alice",
                "namespace": "research",
                "labels": {"app": "jupyterhub"},
                "nodes": [THERMAL_NODES[1]],
                "containers": [{"name": "notebook", "gpus": 1}],
            },
        ],
    }
    sim_fleet.Fleet.model_validate(description)
    return description


# ---- the simulator as a process ----------------------------------------------------------


class SimProcess:
    """``remediator sim`` over plain HTTP on one port for its whole life, state file included."""

    token = "chaos-sim-token"

    def __init__(self, workdir: pathlib.Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.fleet_file = workdir / "fleet.yaml"
        self.fleet_file.write_text(yaml.safe_dump(fleet_description()), encoding="utf-8")
        self.state_file = workdir / "sim-state.json"
        self.log = workdir / "sim.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts: list[str] = []
        self.earlier_execs: list[dict[str, Any]] = []
        """Exec sessions of the simulator's earlier boots (each boot keeps only its own)."""
        self.lost_mutations: list[dict[str, Any]] = []
        """The mutation log of state epochs a restart threw away."""

    def start(self, timeout: float = 30, *, restore: str = "all") -> None:
        argv = [
            *(sys.executable, "-m", "remediator", "sim", "--no-tls"),
            *("--listen", f"127.0.0.1:{self.port}", "--token", self.token),
            *("--kubeconfig", str(self.workdir / "sim.kubeconfig")),
            *("--fleet", str(self.fleet_file), "--time-scale", str(TIME_SCALE)),
            *("--state-file", str(self.state_file), "--restore", restore),
        ]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the simulator exited with {self.proc.returncode}")
            try:
                if httpx.get(f"{self.url}/readyz", headers=self.headers, timeout=1).is_success:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"the simulator was not ready after {timeout}s")

    def stop(self) -> None:
        """SIGTERM: the simulator saves its state file and exits."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self, *, keep_state: bool) -> None:
        """Restart keeping everything, or losing every Kubernetes object (back to the fleet: an
        API server that lost its etcd) while the GPUs keep their power limits (those live in
        the driver on the node)."""
        self.earlier_execs += self.admin("GET", "/execs")
        if not keep_state:
            self.lost_mutations += self.admin("GET", "/mutations")["entries"]
        self.stop()
        moment = dt.datetime.now(dt.UTC).strftime("%H:%M:%S")
        what = "kept its state" if keep_state else "lost its objects (GPUs kept their limits)"
        self.restarts.append(f"{what} at {moment} UTC")
        self.start(restore="all" if keep_state else "gpus")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        response = httpx.request(
            method, f"{self.url}/sim/v1{path}", json=body, headers=self.headers, timeout=10
        )
        response.raise_for_status()
        return response.json()

    def set_faults(self, config: dict[str, Any]) -> None:
        self.admin("PUT", "/faults", config)


# ---- alerts ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Episode:
    """One firing of one alert (Alertmanager's fingerprint and startsAt), maybe resolved."""

    alertname: str
    node: str
    gpu: int
    starts: dt.datetime
    ends: dt.datetime | None

    @property
    def uuid(self) -> str:
        return sim_fleet.gpu_uuid(self.node, self.gpu)

    @property
    def labels(self) -> dict[str, str]:
        template = am_payload(TEMPLATES[self.alertname])["alerts"][0]["labels"]
        return template | {
            "Hostname": self.node,
            "node": self.node,
            "instance": f"{self.node}:9400",
            "UUID": self.uuid,
            "gpu": str(self.gpu),
            "device": f"nvidia{self.gpu}",
            "pci_bus_id": sim_fleet.pci_bus_id(self.gpu),
        }

    @property
    def fingerprint(self) -> str:
        text = json.dumps(sorted(self.labels.items()))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe(self) -> str:
        return (
            f"{self.alertname} on {self.node} GPU {self.gpu} ({self.uuid}), fingerprint "
            f"{self.fingerprint}, startsAt {_stamp(self.starts)}"
        )


def _stamp(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 10000:02d}Z"


@dataclasses.dataclass(frozen=True)
class Delivery:
    at: float
    """Seconds after the storm starts."""
    episode: Episode
    status: str

    def body(self) -> bytes:
        """The captured body of this alert, re-addressed to the episode's node and GPU."""
        payload = copy.deepcopy(am_payload(TEMPLATES[self.episode.alertname]))
        alert = payload["alerts"][0]
        labels = self.episode.labels
        summary = f"GPU {self.episode.gpu} on {self.episode.node}: {self.episode.alertname}"
        alert |= {
            "status": self.status,
            "labels": labels,
            "annotations": {"summary": summary, "description": self.episode.describe()},
            "startsAt": _stamp(self.episode.starts),
            "endsAt": "0001-01-01T00:00:00Z",
            "fingerprint": self.episode.fingerprint,
        }
        if self.status == "resolved" and self.episode.ends is not None:
            alert["endsAt"] = _stamp(self.episode.ends)
        group = {"alertname": self.episode.alertname, "node": self.episode.node}
        payload |= {
            "status": self.status,
            "alerts": [alert],
            "groupLabels": group,
            "commonLabels": labels,
            "commonAnnotations": alert["annotations"],
            "groupKey": "{}:{" + ", ".join(f'{k}="{v}"' for k, v in group.items()) + "}",
        }
        return json.dumps(payload).encode()


@dataclasses.dataclass(frozen=True)
class Plan:
    seed: int
    deliveries: tuple[Delivery, ...]
    uptimes: tuple[float, ...]
    """How long the server runs before each SIGKILL."""
    sim_restarts: tuple[tuple[float, bool], ...]
    """When the simulator restarts (seconds into the storm) and whether it keeps its state."""

    @property
    def episodes(self) -> list[Episode]:
        return list(dict.fromkeys(d.episode for d in self.deliveries))


HARDWARE_ALERTS = ("GPUXidError79", "GPUECCUncorrectableError")


def _nodes_for(alertname: str) -> tuple[str, ...]:
    if alertname in HARDWARE_ALERTS:
        return HARDWARE_NODES
    return THERMAL_NODES if alertname == "GPUTemperatureCritical" else GPU_NODES


def _deliveries(
    rng: random.Random, episode: Episode, start: float, end: float | None, storm_seconds: float
) -> list[Delivery]:
    """The episode's firing, 0-2 repeats, and its resolution (sometimes delivered twice)."""
    found = [Delivery(start, episode, "firing")]
    last = end if end is not None else storm_seconds
    for _ in range(rng.choice((0, 1, 1, 2))):
        found.append(Delivery(rng.uniform(start, last), episode, "firing"))
    if end is not None:
        found.append(Delivery(end, episode, "resolved"))
        if rng.random() < 0.3:
            found.append(Delivery(end + rng.uniform(0.2, 3), episode, "resolved"))
    return found


def make_plan(seed: int, *, storm_seconds: float = 50.0, kills: int = 22) -> Plan:
    """Thermal alerts fire over the first three quarters of the storm, hardware alerts over the
    first third; the simulator restarts keeping its state a quarter in, and loses it after the
    last hardware alert fired (once their runs are done: see ``Monkey``)."""
    rng = random.Random(seed)
    deliveries: list[Delivery] = []
    free_at: dict[tuple[str, str, int], float] = {}
    hardware_starts = [0.0]
    for alertname, count in EPISODES.items():
        latest = storm_seconds * (0.35 if alertname in HARDWARE_ALERTS else 0.75)
        for _ in range(count):
            key = (alertname, rng.choice(_nodes_for(alertname)), rng.randrange(GPUS_PER_NODE))
            start = max(rng.uniform(0, latest), free_at.get(key, 0))
            # Two in five resolve within 1.5 s, while their first steps still run.
            length = rng.uniform(0.1, 1.5) if rng.random() < 0.4 else rng.uniform(2, 15)
            end = None
            if alertname not in HARDWARE_ALERTS or rng.random() < 0.5:
                end = max(start + 0.05, min(start + length, storm_seconds - rng.uniform(0, 1)))
            moment = ORIGIN + dt.timedelta(seconds=start)
            ends = ORIGIN + dt.timedelta(seconds=end) if end is not None else None
            episode = Episode(*key, starts=moment, ends=ends)
            deliveries += _deliveries(rng, episode, start, end, storm_seconds)
            free_at[key] = (end if end is not None else 1e9) + 0.5
            if alertname in HARDWARE_ALERTS:
                hardware_starts.append(start)
    deliveries.sort(key=lambda d: (d.at, d.status == "resolved"))
    uptimes = tuple(rng.uniform(0.2, 1.6) for _ in range(kills))
    restarts = ((storm_seconds / 4, True), (max(hardware_starts) + 3.0, False))
    return Plan(seed, tuple(deliveries), uptimes, sim_restarts=restarts)


# ---- actors ------------------------------------------------------------------------------


class Actor(threading.Thread):
    """A thread whose exception is kept for the test to re-raise."""

    def __init__(self, name: str, stop: threading.Event) -> None:
        super().__init__(name=name, daemon=True)
        self.stop = stop
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.act()
        except BaseException as e:
            self.error = e
            self.stop.set()

    def act(self) -> None:
        raise NotImplementedError

    def pause(self, seconds: float) -> bool:
        """Sleep; False when the storm was stopped meanwhile."""
        return not self.stop.wait(max(0.0, seconds))


@dataclasses.dataclass(frozen=True)
class Acked:
    delivery: Delivery
    body: bytes
    answer: dict[str, Any]


class Alertmanager(Actor):
    """Sends its deliveries in order, each retried until the server answers 200."""

    def __init__(
        self, name: str, stop: threading.Event, *, url: str, deliveries: list[Delivery], t0: float
    ) -> None:
        super().__init__(name, stop)
        self.url = f"{url}/api/v1/alerts"
        self.deliveries = deliveries
        self.t0 = t0
        self.acked: list[Acked] = []
        self.refused: list[tuple[Delivery, int, str]] = []

    def act(self) -> None:
        with httpx.Client(timeout=5) as http:
            for delivery in self.deliveries:
                if not self.pause(self.t0 + delivery.at - time.monotonic()):
                    return
                self.deliver(http, delivery)

    def deliver(self, http: httpx.Client, delivery: Delivery) -> None:
        body = delivery.body()
        headers = {"Content-Type": "application/json"}
        while not self.stop.is_set():
            try:
                response = http.post(self.url, content=body, headers=headers)
            except httpx.TransportError:
                self.pause(0.1)
                continue
            if response.status_code == 200:
                self.acked.append(Acked(delivery, body, response.json()))
                return
            if response.status_code in (429, 500, 502, 503, 504):
                self.pause(0.2)
                continue
            self.refused.append((delivery, response.status_code, response.text[:500]))
            return


class Monkey(Actor):
    """SIGKILLs the server after each planned uptime and starts it again at once; restarts the
    simulator where the plan says (once keeping its state, once losing it)."""

    def __init__(
        self,
        stop: threading.Event,
        *,
        serve: Serve,
        sim: SimProcess,
        plan: Plan,
    ) -> None:
        super().__init__("monkey", stop)
        self.serve, self.sim, self.plan = serve, sim, plan
        self.kills = 0
        self.downtime = 0.0
        self.t0 = time.monotonic()
        """When the storm started (set by ``Storm.run``)."""

    @property
    def mean_downtime(self) -> float:
        return self.downtime / self.kills if self.kills else 0.0

    def act(self) -> None:
        restarts = list(self.plan.sim_restarts)
        for uptime in self.plan.uptimes:
            if not self.pause(uptime):
                return
            while restarts and time.monotonic() - self.t0 >= restarts[0][0]:
                if not self.restart_sim(keep_state=restarts.pop(0)[1]):
                    return
            self.serve.kill()
            self.kills += 1
            started = time.monotonic()
            self.serve.start(timeout=30)
            self.downtime += time.monotonic() - started
        for _, keep_state in restarts:
            if not self.restart_sim(keep_state=keep_state):
                return

    def quiet(self) -> bool:
        """No Xid or ECC run is active (they are the runs whose effects stay)."""
        try:
            listed = httpx.get(f"{self.serve.url}/api/v1/runs", params={"limit": 500}, timeout=5)
            runs = listed.json()["items"]
        except (httpx.HTTPError, ValueError, KeyError):
            return False
        return not [
            r
            for r in runs
            if r["node"] in HARDWARE_NODES
            and r["onResolve"] == "continue"
            and r["status"] in ("pending", "running", "waiting_approval")
        ]

    def restart_sim(self, *, keep_state: bool) -> bool:
        """Restart the simulator. Before losing its state, stop killing the server until the
        Xid and ECC runs are done (20 s at most), so what the restart wipes are cordons, labels
        and taints nobody is about to apply again. False if the storm was stopped meanwhile."""
        deadline = time.monotonic() + 20
        while not keep_state and not self.quiet() and time.monotonic() < deadline:
            if not self.pause(0.5):
                return False
        self.sim.restart(keep_state=keep_state)
        self.sim.set_faults(fault_rules(self.plan.seed + len(self.sim.restarts)))
        return True


class Operator(Actor):
    """On-call: approves waiting steps through the API; rejects one in ten (seeded per step)."""

    def __init__(self, stop: threading.Event, *, url: str, seed: int) -> None:
        super().__init__("operator", stop)
        self.url = url
        self.seed = seed
        self.decisions: dict[tuple[int, int], str] = {}

    def decide(self, run_id: int, step_id: int) -> str:
        draw = random.Random(f"{self.seed}:{run_id}:{step_id}").random()
        return "reject" if draw < 0.1 else "approve"

    def act(self) -> None:
        with httpx.Client(base_url=self.url, timeout=5) as http:
            while self.pause(0.3):
                try:
                    waiting = http.get("/api/v1/approvals").json()["items"]
                    for item in waiting:
                        run_id, step_id = item["run"]["id"], item["step"]["id"]
                        verb = self.decide(run_id, step_id)
                        comment = f"chaos operator: {verb}"
                        answer = http.post(
                            f"/api/v1/runs/{run_id}/steps/{step_id}/{verb}",
                            json={"comment": comment},
                        )
                        if answer.status_code == 200:
                            self.decisions[(run_id, step_id)] = verb
                except (httpx.TransportError, ValueError, KeyError):
                    continue  # the server is down or restarting


class Storm:
    """The plan played by four Alertmanager senders and the monkey, with on-call approving
    throughout and after (until ``finish``)."""

    def __init__(self, plan: Plan, *, sim: SimProcess, serve: Serve) -> None:
        self.plan, self.sim, self.serve = plan, sim, serve
        self.stopped, self.off_call = threading.Event(), threading.Event()
        self.senders: list[Alertmanager] = []
        self.monkey = Monkey(self.stopped, serve=serve, sim=sim, plan=plan)
        self.operator = Operator(self.off_call, url=serve.url, seed=plan.seed)
        self.seconds = 0.0

    def run(self, limit: float) -> list[str]:
        """Play the plan with faults on; the names of actors still busy after ``limit``."""
        self.sim.set_faults(fault_rules(self.plan.seed))
        t0 = time.monotonic()
        self.senders = [
            Alertmanager(f"alertmanager-{i}", self.stopped, url=self.serve.url, deliveries=d, t0=t0)
            for i, d in enumerate(by_worker(self.plan, 4))
        ]
        self.monkey.t0 = t0
        players: list[Actor] = [*self.senders, self.monkey]
        for actor in [*players, self.operator]:
            actor.start()
        for actor in players:
            actor.join(max(0.0, t0 + limit - time.monotonic()))
        self.seconds = time.monotonic() - t0
        busy = [actor.name for actor in players if actor.is_alive()]
        self.stopped.set()
        for actor in players:
            actor.join(max(0.0, t0 + limit + 10 - time.monotonic()))
            if actor.error is not None:
                raise actor.error
        self.sim.set_faults({"rules": []})
        if self.serve.proc is None or self.serve.proc.poll() is not None:
            self.serve.start()
        return busy

    def finish(self) -> None:
        self.stopped.set()
        self.off_call.set()
        self.operator.join(10)

    @property
    def acked(self) -> list[Acked]:
        return [ack for sender in self.senders for ack in sender.acked]

    @property
    def refused(self) -> list[tuple[Delivery, int, str]]:
        return [item for sender in self.senders for item in sender.refused]

    def summary(self) -> str:
        return (
            f"storm {self.seconds:.0f}s; {len(self.acked)} of {len(self.plan.deliveries)} "
            f"deliveries answered 200 ({len(self.plan.episodes)} episodes); "
            f"{self.monkey.kills} SIGKILLs of serve (back after {self.monkey.mean_downtime:.1f}s "
            f"on average); simulator restarted ({', '.join(self.sim.restarts)}); "
            f"{len(self.operator.decisions)} approval decisions"
        )


def by_worker(plan: Plan, workers: int) -> Iterator[list[Delivery]]:
    """Deliveries split over ``workers`` senders, every alert's deliveries on one of them (so
    its firing, repeats and resolution arrive in order, as from Alertmanager's group)."""
    for worker in range(workers):
        yield [d for d in plan.deliveries if int(d.episode.fingerprint, 16) % workers == worker]


# ---- reading the outcome -----------------------------------------------------------------


def pages(get: Callable[..., Any], path: str, **params: Any) -> list[dict[str, Any]]:
    """Every item of a cursor-paged listing."""
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = get(path, limit=500, **params, **({"cursor": cursor} if cursor else {}))
        items += page["items"]
        cursor = page.get("nextCursor")
        if not cursor:
            return items
