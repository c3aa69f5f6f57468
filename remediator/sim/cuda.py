"""CUDA sample pods: the vectorAdd smoke test a validation runs on a node.

A pod whose container runs a CUDA vectorAdd sample image (``…cuda-sample:vectoradd…``, as
NVIDIA publishes it) and requests ``nvidia.com/gpu`` runs to completion when the kubelet
starts it, like the real sample: the device manager gives it a healthy GPU (``kubelet``) and it
exits 0 printing "Test PASSED"; with no healthy GPU free the kubelet refuses to admit it (phase
``Failed``, reason ``UnexpectedAdmissionError``, as a real kubelet does when the device plugin
has too few healthy devices); a GPU that answers badly (fallen off the bus, uncorrectable ECC
errors appearing after allocation) makes the sample exit 1 with CUDA's error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from remediator.sim import kubelet, objects, store

if TYPE_CHECKING:
    from remediator.sim import cluster as cluster_mod

Obj = dict[str, Any]
SAMPLE = "cuda-sample:vectoradd"
PASSED = (
    "[Vector addition of 50000 elements]\nCopy input data from the host memory to the CUDA "
    "device\nCUDA kernel launch with 196 blocks of 256 threads\nCopy output data from the CUDA "
    "device to the host memory\nTest PASSED\nDone\n"
)
FAILED = (
    "[Vector addition of 50000 elements]\nFailed to allocate device vector A (error code "
    "no CUDA-capable device is detected)!\n"
)


def is_sample(pod: Obj) -> bool:
    return objects.gpu_request(pod) > 0 and any(
        SAMPLE in str(c.get("image", "")) for c in pod.get("spec", {}).get("containers", [])
    )


def run(cluster: cluster_mod.Cluster, pod: Obj) -> tuple[str, int | None, str, str]:
    """(phase, exit code, reason, message) of the sample pod as the kubelet ends it."""
    node = pod["spec"]["nodeName"]
    wanted = objects.gpu_request(pod)
    entry = kubelet.allocations(cluster, node).get(pod["metadata"]["uid"])
    if entry is None:
        message = (
            f"Allocate failed due to requested number of devices unavailable for "
            f"nvidia.com/gpu. Requested: {wanted}, Available: 0, which is unexpected"
        )
        return "Failed", None, "UnexpectedAdmissionError", message
    host = cluster.hosts.get(node)
    gpus = [g for g in (host.gpus if host else []) if g.uuid in entry["devices"]]
    if not gpus or any(g.lost or g.ecc_uncorrected_volatile for g in gpus):
        return "Failed", 1, "Error", FAILED
    return "Succeeded", 0, "Completed", PASSED


def finish(pod: Obj, *, phase: str, exit_code: int | None, reason: str, message: str) -> None:
    """Write the outcome into the pod's status (what ``run`` decided)."""
    now = store.timestamp()
    status = pod.setdefault("status", {})
    status["phase"] = phase
    if exit_code is None:  # never admitted: no container ran
        status.update(reason=reason, message=message)
        return
    status["containerStatuses"] = [
        {
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": "",
            "ready": False,
            "restartCount": 0,
            "started": False,
            "state": {
                "terminated": {
                    "exitCode": exit_code,
                    "reason": reason,
                    "message": message[-1024:],
                    "startedAt": now,
                    "finishedAt": now,
                }
            },
        }
        for c in pod["spec"].get("containers", [])
    ]
