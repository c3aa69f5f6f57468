"""A simulated GPU cluster that speaks the Kubernetes REST API.

The simulator is a single aiohttp application: an in-memory object store with etcd-like
resource versions and watches, the API routes kubectl and kubernetes_asyncio use, a small
controller loop (graceful termination, ReplicaSet/StatefulSet/DaemonSet replacements, a
scheduler honouring cordons and taints), PodDisruptionBudget-aware evictions, and exec into
GPU driver pods running a simulated ``nvidia-smi`` over per-GPU state.

It stands alone: nothing here imports other remediator packages or kubernetes_asyncio.
"""

from __future__ import annotations
