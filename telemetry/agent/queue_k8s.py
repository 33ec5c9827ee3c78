"""Kubernetes' pending GPU pods as queue entries (DESIGN.md §9.2, docs/agent.md "Queue
pressure"): the second source of ``--queue``, read in the cluster with the pod's service
account.

One entry per pod that is ``Pending``, not bound to a node yet, and asks for ``nvidia.com/gpu``
in any container. The entry:

* ``kind`` ``k8s``; ``id`` ``namespace/name``; ``user`` and ``account`` the namespace (the
  unit Kubernetes' quotas and RBAC know; a team per namespace is the common layout);
* ``partition`` the Kueue queue the pod names (label ``kueue.x-k8s.io/queue-name``), else
  ``default``: the fleet file's ``[[partitions]]`` map these names to pools;
* ``gpus`` the pod's effective request: the larger of the sum over its containers and the
  largest init container (how the scheduler counts it), a container's request being its
  ``requests`` or, when only limits are given, its ``limits`` (Kubernetes copies them);
* ``gpu_model`` the node selector ``nvidia.com/gpu.product`` (GPU feature discovery's label,
  e.g. ``NVIDIA-H100-80GB-HBM3``) when the pod names one, else null;
* ``reason`` the ``PodScheduled`` condition's reason: ``Unschedulable`` (no node has the
  GPUs free: class capacity), ``SchedulingGated`` (a scheduling gate, as queueing systems set:
  class policy); a pod the scheduler has not looked at yet has reason ``Pending`` (class user);
* ``submitted`` the pod's creation time; ``eligible`` the same, or null while it is gated.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from .queue_slurm import QueueError

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
GPU_RESOURCE = "nvidia.com/gpu"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
MODEL_SELECTOR = "nvidia.com/gpu.product"
DEFAULT_PARTITION = "default"
# Pods per page of the list (the API server's own default page size is unbounded).
PAGE = 500
TIMEOUT_S = 30.0

_RFC3339_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def quantity(v: Any) -> int:
    """A whole-device quantity: ``2``, ``"2"``; ``"2000m"`` is 2 (milli-units); anything else
    is 0 (an extended resource is always a whole number)."""
    if isinstance(v, bool):
        return 0
    if isinstance(v, int):
        return max(v, 0)
    if not isinstance(v, str):
        return 0
    m = re.fullmatch(r"\s*(\d+)(m?)\s*", v)
    if m is None:
        return 0
    n = int(m[1])
    return n // 1000 if m[2] else n


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _container_gpus(c: Any) -> int:
    res = c.get("resources") if isinstance(c, dict) else None
    if not isinstance(res, dict):
        return 0
    for part in ("requests", "limits"):
        d = res.get(part)
        if isinstance(d, dict) and GPU_RESOURCE in d:
            return quantity(d[GPU_RESOURCE])
    return 0


def pod_gpus(spec: Any) -> int:
    """The pod's effective GPU request (see the module's docstring)."""
    if not isinstance(spec, dict):
        return 0
    main = sum(_container_gpus(c) for c in _list(spec.get("containers")))
    init = max((_container_gpus(c) for c in _list(spec.get("initContainers"))), default=0)
    return max(main, init)


def _stamp(v: Any) -> str | None:
    return v if isinstance(v, str) and _RFC3339_Z.match(v) else None


def pod_entry(pod: Any) -> dict[str, Any] | None:
    """The queue entry of one pod, or ``None`` when it waits for no GPU."""
    if not isinstance(pod, dict):
        return None
    meta, spec, status = (
        _dict(pod.get("metadata")),
        _dict(pod.get("spec")),
        _dict(pod.get("status")),
    )
    if status.get("phase") != "Pending" or spec.get("nodeName"):
        return None  # bound to a node: it holds its GPUs (pulling images), it waits for none
    gpus = pod_gpus(spec)
    if gpus < 1:
        return None
    reason = "Pending"
    for cond in _list(status.get("conditions")):
        if (
            isinstance(cond, dict)
            and cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and isinstance(cond.get("reason"), str)
        ):
            reason = cond["reason"]
    klass = {"Unschedulable": "capacity", "SchedulingGated": "policy"}.get(reason, "user")
    namespace = str(meta.get("namespace") or "default")
    model = _dict(spec.get("nodeSelector")).get(MODEL_SELECTOR)
    created = _stamp(meta.get("creationTimestamp"))
    return {
        "kind": "k8s",
        "id": f"{namespace}/{meta.get('name', '')}",
        "user": namespace,
        "account": namespace,
        "partition": str(_dict(meta.get("labels")).get(QUEUE_LABEL) or DEFAULT_PARTITION),
        "gpus": gpus,
        "gpu_model": model if isinstance(model, str) and model else None,
        "reason": reason,
        "class": klass,
        "submitted": created,
        "eligible": None if reason == "SchedulingGated" else created,
    }


def pod_list_entries(doc: Any) -> list[dict[str, Any]]:
    """The entries of one ``PodList`` answer (``GET /api/v1/pods``)."""
    items = doc.get("items") if isinstance(doc, dict) else None
    out = []
    for pod in items if isinstance(items, list) else []:
        entry = pod_entry(pod)
        if entry is not None:
            out.append(entry)
    return out


class KubeSource:
    """The API server as a pod reaches it: ``https://$KUBERNETES_SERVICE_HOST:
    $KUBERNETES_SERVICE_PORT``, the service account's token (read at every poll: projected
    tokens rotate) and CA. Lists pending pods in every namespace, page by page."""

    def __init__(
        self,
        *,
        api: str | None = None,
        sa_dir: str = SERVICE_ACCOUNT_DIR,
        timeout_s: float = TIMEOUT_S,
        page: int = PAGE,
    ) -> None:
        if api is None:
            host = os.environ.get("KUBERNETES_SERVICE_HOST")
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            if not host:
                raise ValueError(
                    "--queue k8s runs inside the cluster: KUBERNETES_SERVICE_HOST is not set"
                )
            api = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        self.api = api.rstrip("/")
        self.sa_dir = sa_dir
        self.timeout_s = timeout_s
        self.page = page
        self._ssl: ssl.SSLContext | None = None

    def _context(self) -> ssl.SSLContext:
        if self._ssl is None:
            try:
                self._ssl = ssl.create_default_context(cafile=os.path.join(self.sa_dir, "ca.crt"))
            except (OSError, ssl.SSLError) as e:
                raise QueueError(f"cannot read the cluster's CA in {self.sa_dir}: {e}") from None
        return self._ssl

    def _get(self, query: dict[str, str], token: str) -> Any:
        url = f"{self.api}/api/v1/pods?{urllib.parse.urlencode(query)}"
        req = urllib.request.Request(
            url, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s, context=self._context()) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            if e.code in (401, 403):
                raise QueueError(
                    f"the API server refused to list pods ({e.code}): the service account "
                    "needs a ClusterRole that may list pods (docs/agent.md)"
                ) from None
            raise QueueError(f"the API server answered {e.code} listing pods") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise QueueError(f"cannot list pods at {self.api}: {e}") from None

    def __call__(self) -> list[dict[str, Any]]:
        try:
            with open(os.path.join(self.sa_dir, "token"), encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as e:
            raise QueueError(f"cannot read the service account token: {e}") from None
        out: list[dict[str, Any]] = []
        query = {"fieldSelector": "status.phase=Pending", "limit": str(self.page)}
        while True:
            doc = self._get(query, token)
            out.extend(pod_list_entries(doc))
            meta = doc.get("metadata") if isinstance(doc, dict) else None
            cont = meta.get("continue") if isinstance(meta, dict) else None
            if not cont:
                return out
            query = {**query, "continue": str(cont)}
