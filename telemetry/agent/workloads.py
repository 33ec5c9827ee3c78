"""Who holds a GPU (docs/agent.md): processes mapped to their workloads through ``/proc``, and
allocations that a scheduler hook writes into a directory.

Each second the NVML collector lists the processes on each GPU and asks :class:`Discovery`
which workloads hold it: the workload of each process (:class:`ProcResolver`) and every
allocation that names the GPU (:class:`AllocationDir`), de-duplicated by (kind, id). The answer
is ``None`` when it cannot tell (a process it cannot see), ``()`` when nothing holds the GPU.

A process belongs to the first of these that its ``/proc/<pid>/cgroup`` places it in (any line,
so cgroup v1's per-controller lines and v2's single line alike), each believed only at the
position, counted from the hierarchy's root, where the root-run daemon that owns it creates it.
Only root creates cgroups there; a user's delegated subtree
(``/user.slice/user-1001.slice/user@1001.service/…``) or a job's own sub-cgroups may hold any
names, so a ``job_<id>``, ``pod<uid>`` or container id anywhere else says nothing
(docs/agent.md, "What the agent trusts"):

* a Slurm job: ``/slurm/uid_<uid>/job_<id>/…`` (v1; ``slurm_<node>`` with several slurmds),
  ``/system.slice/slurmstepd.scope/job_<id>/…`` (v2; ``<node>_slurmstepd.scope``). Slurm names
  the job's cgroup by its numeric job id, also for an array task (each task is a job of its
  own). The array form ``123_4`` comes from an allocation file that says so (``job_id``), or
  from the process's environment (``SLURM_ARRAY_JOB_ID``, ``SLURM_ARRAY_TASK_ID``) where that
  names the process's own job and no other job claims the same form;
* a Kubernetes pod: ``pod<uid>`` under kubelet's ``kubepods`` hierarchy at the root,
  ``/kubepods[/burstable|/besteffort]/pod<uid>/`` (cgroupfs) or
  ``/kubepods.slice[/kubepods-<qos>.slice]/kubepods[-<qos>]-pod<uid with _>.slice/`` (systemd),
  and containerd's v1 ``name=systemd`` line under ``/system.slice/containerd.service/``. Its id
  is ``namespace/pod`` from the name of the pod's log directory, which kubelet creates on the
  host as ``<pod log root>/<namespace>_<name>_<uid>`` (:meth:`ProcResolver._pod`); else the pod
  UID, with no account. Never the container's own service-account namespace file or its
  ``HOSTNAME``: a container that can write its own file system and environment writes those;
* a container: a 64-hex id as the second segment (``/docker/<id>``, ``/<containerd
  namespace>/<id>``, ``/system.slice/docker-<id>.scope``, ``…/crio-<id>.scope``,
  ``/machine.slice/libpod-<id>.scope``);
* else the process's user (``/proc/<pid>/status`` real Uid, its name, or the number where the
  name is unknown). The user is always that uid: never ``SLURM_JOB_USER`` or
  ``SLURM_JOB_ACCOUNT`` from the environment, which the job's user writes.

A process whose own claims disagree with what the agent believes (its environment names another
job than its cgroup, its job's allocation file names another user than it runs as) is its
user's, kind ``user``.

A pid is resolved once: the answer is kept with the process's start time
(``/proc/<pid>/stat``), read again every second, so a pid reused by another process is resolved
again. Entries for pids not seen for a while are dropped. The reads of a new process
(``cgroup``, ``status``, ``environ``, which its owner can make hang, for instance by locking its
memory, and the pod log root's listing) run in a thread of their own: a tick waits for them at
most ``RESOLVE_WAIT_S`` in all, and a read that never returns costs that
process's GPU its workloads, never the sampling. Every read is non-blocking, of regular files
only and size-bounded (:func:`_read`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pwd
import re
import stat
import threading
import time
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .source import Workload

log = logging.getLogger("gpufleet.agent")

DEFAULT_PROC_ROOT = "/proc"
DEFAULT_ALLOC_DIR = "/run/gpufleet/alloc"
# kubelet's podLogsDir (KubeletConfiguration; /var/log/pods unless a site moved it)
DEFAULT_POD_LOG_ROOT = "/var/log/pods"

KINDS = frozenset({"slurm", "k8s", "container", "user"})

# cgroup path segments, each at the position its daemon creates it, counted from the root of the
# hierarchy (see the module docstring; the formats are written out, with their sources, in
# tests/agent/procfs.py)
_SLURM_JOB = re.compile(r"job_([0-9]{1,12})")
_SLURM_V1_ROOT = re.compile(r"slurm(?:_[^/]+)?")
_SLURM_V1_UID = re.compile(r"uid_[0-9]+")
_SLURM_V2_SCOPE = re.compile(r"(?:[^/]+_)?slurmstepd\.scope")
_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
# a static pod's UID is a 32-hex hash of its manifest, without dashes
_POD_UID = rf"({_UID}|[0-9a-f]{{32}})"
_QOS = ("burstable", "besteffort")
_POD_CGROUPFS = re.compile(rf"pod{_POD_UID}")
_POD_SYSTEMD = re.compile(rf"kubepods(?:-(?:burstable|besteffort))?-pod{_POD_UID}\.slice")
# containerd's v1 name=systemd line: "<pod slice>:cri-containerd:<id>" under containerd.service
_POD_CONTAINERD = re.compile(
    rf"kubepods(?:-(?:burstable|besteffort))?-pod{_POD_UID}\.slice:cri-containerd:[0-9a-f]{{64}}"
)
# "<id>", "docker-<id>.scope", "crio-<id>.scope", "cri-containerd-<id>.scope", "libpod-<id>.scope"
_CONTAINER = re.compile(r"(?:[a-z][a-z0-9-]*-)?([0-9a-f]{64})(?:\.scope)?")
# an array job id or task id in the environment: a job number, not any digit string
_JOB_NUMBER = re.compile(r"[0-9]{1,12}")

# A pod's log directory, as kubelet names it (kuberuntime's BuildPodLogsDirectory:
# "<namespace>_<name>_<uid>", created by createPodSandbox before the pod's first container). A
# namespace is a DNS label and a pod's name a DNS subdomain (the API server validates both), so
# neither holds '_' and the name splits one way only; anything else there is not kubelet's.
_K8S_NAMESPACE = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
_K8S_POD_NAME = re.compile(r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?")
# What the environment may add, where it names the process's own job (SLURM_JOB_ID): the array
# form and the job's name, both the job's user's own labels. Never SLURM_JOB_USER or
# SLURM_JOB_ACCOUNT: the user is the process's uid, the account the allocation file's.
_ENV_KEYS = frozenset(
    {b"SLURM_JOB_ID", b"SLURM_ARRAY_JOB_ID", b"SLURM_ARRAY_TASK_ID", b"SLURM_JOB_NAME"}
)
# /proc/<pid>/environ is the environment the process started with, usually a few KiB
_ENV_MAX = 1 << 20

# A pid's entry is dropped once it has not been on a GPU for this many ticks; the cache never
# holds more than this many entries (a node runs far fewer GPU processes at once).
CACHE_IDLE_TICKS = 120
CACHE_MAX = 4096
# New processes are read in threads of their own (a read of what a process controls may never
# return); one tick waits for them at most this long in all, and at most this many reads are
# under way at once (a read that never returns keeps its thread for good).
RESOLVE_WAIT_S = 0.5
RESOLVE_THREADS = 4
# a read under way this long is said (once): its GPU's workloads are not sent meanwhile
RESOLVE_STUCK_S = 10.0

# An allocation file is a few hundred bytes; anything far larger is not one.
ALLOC_MAX_BYTES = 64 * 1024
# an NVML index (a node has a few dozen GPUs at most), and a GPU UUID ("GPU-" or "MIG-" + 36)
ALLOC_MAX_INDEX = 65535
ALLOC_MAX_UUID = 128
ALLOC_MAX_GPUS = 1024
ALLOC_MAX_PATH = 4096
_INDEX = re.compile(r"[0-9]{1,5}")
# The directory's mtime tells when a file was added, removed or renamed into it (the hooks
# rename a complete file into place). A change within the same mtime tick as the last look is
# caught by looking again while the mtime is this recent; a file rewritten in place without a
# rename, by the full rescan every ALLOC_RESCAN_S.
ALLOC_RACY_S = 2.0
ALLOC_RESCAN_S = 10.0
# The longest problem text sent to the server (its wire limit for ``alloc_problem``).
ALLOC_PROBLEM_MAX = 300


def _path_owner(path: str) -> tuple[str, str] | None:
    """What one cgroup path places a process in, where its segment sits where the runtime's
    root-run daemon creates it (the module docstring)."""
    if not path.startswith("/"):
        return None  # relative to another cgroup namespace's root ("/../.."): no position
    seg = path[1:].split("/")
    n = len(seg)
    if n >= 3:
        if seg[0] == "system.slice" and _SLURM_V2_SCOPE.fullmatch(seg[1]):
            m = _SLURM_JOB.fullmatch(seg[2])
            return ("slurm", m.group(1)) if m else None
        if _SLURM_V1_ROOT.fullmatch(seg[0]) and _SLURM_V1_UID.fullmatch(seg[1]):
            m = _SLURM_JOB.fullmatch(seg[2])
            return ("slurm", m.group(1)) if m else None
    pod: re.Match[str] | None = None
    if seg[0] == "kubepods" and n >= 2:
        pod = _POD_CGROUPFS.fullmatch(seg[1])
        if pod is None and seg[1] in _QOS and n >= 3:
            pod = _POD_CGROUPFS.fullmatch(seg[2])
    elif seg[0] == "kubepods.slice" and n >= 2:
        pod = _POD_SYSTEMD.fullmatch(seg[1])
        if pod is None and seg[1] in {f"kubepods-{q}.slice" for q in _QOS} and n >= 3:
            pod = _POD_SYSTEMD.fullmatch(seg[2])
            if pod is not None and not seg[2].startswith(seg[1][: -len(".slice")] + "-"):
                pod = None  # a QoS level's pods sit in that level's slice
    elif seg[0] == "system.slice" and n >= 3 and seg[1] == "containerd.service":
        pod = _POD_CONTAINERD.fullmatch(seg[2])
    if pod is not None:
        return "k8s", pod.group(1).replace("_", "-")  # the systemd driver writes '-' as '_'
    if n >= 2 and (m := _CONTAINER.fullmatch(seg[1])):
        return "container", m.group(1)
    return None


def cgroup_owner(text: str) -> tuple[str, str] | None:
    """``(kind, id)`` of what a process's ``/proc/<pid>/cgroup`` places it in: a Slurm job
    (``slurm``, job id), a Kubernetes pod (``k8s``, pod UID) or a container (``container``, its
    64-hex id), in that order of precedence, each only where its daemon creates it; ``None`` for
    a plain process (or one whose cgroup only its user named)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        # "hierarchy-id:controllers:path"; the path itself may hold ':' (":cri-containerd:")
        owner = _path_owner(line.split(":", 2)[-1])
        if owner is not None:
            found.setdefault(owner[0], owner[1])
    for kind in ("slurm", "k8s", "container"):
        if kind in found:
            return kind, found[kind]
    return None


class SaidOnce:
    """Logs a warning once per key: a problem met on every tick (a forged cgroup, a bad
    allocation file) would otherwise flood the log. The keys are bounded (cleared when full),
    so a workload that makes new keys forever costs no memory, only a repeated line."""

    MAX_KEYS = 10_000

    def __init__(self) -> None:
        self._keys: set[Hashable] = set()

    def __call__(self, key: Hashable, message: str, *args: object) -> bool:
        """Log it unless ``key`` was said; True when it was logged now."""
        if key in self._keys:
            return False
        if len(self._keys) >= self.MAX_KEYS:
            self._keys.clear()
        self._keys.add(key)
        log.warning(message, *args)
        return True


class NotRegularFile(OSError):
    """A path a workload may control names a FIFO, device, socket, directory or link."""


def _read(path: str, limit: int = 65536) -> bytes:
    """At most ``limit`` bytes of the regular file at ``path``, without ever waiting on what a
    workload can put there: a FIFO's open would wait for a writer forever, a device's open may
    act on it. So: ``lstat`` first (nothing but a regular file is opened), then a non-blocking
    open that follows no link in the last component, and ``fstat`` of what was opened (the path
    may have been swapped since). ``/proc`` files are regular files too."""
    before = os.lstat(path)
    if not stat.S_ISREG(before.st_mode):
        raise NotRegularFile(f"{path} is not a regular file")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (
            before.st_dev,
            before.st_ino,
        ):
            raise NotRegularFile(f"{path} changed while being opened")
        chunks: list[bytes] = []
        left = limit
        while left > 0:
            chunk = os.read(fd, left)  # /proc files may answer in pieces
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _trusted_owners(owners: Collection[int] | None) -> frozenset[int]:
    """Who may own what the agent believes: ``owners``, by default root and the agent's user."""
    return frozenset(owners) if owners is not None else frozenset({0, os.geteuid()})


def _untrusted(st: os.stat_result, owners: Collection[int]) -> str | None:
    """Why a file or directory with this ``stat`` may hold what someone other than a root-run
    daemon (the scheduler's hook, kubelet) wrote; ``None`` where it cannot."""
    if st.st_uid not in owners:
        return f"belongs to uid {st.st_uid}, not to root (or the agent's user)"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def user_name(uid: int) -> str:
    """The user's name, or the number where the node does not know it."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class _Entry:
    __slots__ = ("start", "workload", "seen")

    def __init__(self, start: int, workload: Workload, seen: int) -> None:
        self.start = start
        self.workload = workload
        self.seen = seen


# what the reads of one process give: its workload, and the array form its environment claims
# for its job (``None``: none claimed)
_Resolved = tuple[Workload, str | None]


class _Pending:
    """The reads of one new process, under way in a thread of their own."""

    __slots__ = ("start", "since", "done", "result")

    def __init__(self, start: int, since: float) -> None:
        self.start = start
        self.since = since  # time.monotonic() when the reads began
        self.done = threading.Event()
        self.result: _Resolved | None = None


class ProcessResolver(Protocol):
    """Process id → the workload it belongs to (``None``: the process cannot be seen)."""

    # Slurm numeric job id → the array form ``<array job>_<task>`` its processes' environment
    # claims (Discovery believes a claim no other job makes), and a counter that moves whenever
    # that map changes.
    aliases: dict[str, str]
    aliases_version: int

    def resolve(self, pid: int) -> Workload | None: ...

    def tick(self) -> None:
        """Once per agent tick, before the pids of that tick are resolved."""
        ...


class ProcResolver:
    """Resolves process ids through a ``/proc`` tree (``proc_root``: the host's, or a fake one
    in tests). ``users`` maps a uid to a name (default: the node's passwd); ``pod_log_root``:
    kubelet's pod log directory on this host, whose entries name the pods (:meth:`_pod`), believed
    where it and they belong to one of ``owners`` (default: root, and the agent's own user);
    ``wait_s``: the most one tick waits for the reads of new processes."""

    def __init__(
        self,
        proc_root: str = DEFAULT_PROC_ROOT,
        *,
        users: Callable[[int], str] = user_name,
        pod_log_root: str = DEFAULT_POD_LOG_ROOT,
        owners: Collection[int] | None = None,
        wait_s: float = RESOLVE_WAIT_S,
    ) -> None:
        self.root = proc_root.rstrip("/") or "/"
        self.users = users
        self.pod_log_root = pod_log_root
        self.owners = _trusted_owners(owners)
        self.wait_s = wait_s
        self.aliases: dict[str, str] = {}
        self.aliases_version = 0
        self._refused: set[str] = set()  # jobs whose processes claimed two array forms
        self._cache: dict[int, _Entry] = {}
        self._names: dict[int, str] = {}
        self._pending: dict[int, _Pending] = {}
        self._slots = threading.BoundedSemaphore(RESOLVE_THREADS)
        self._deadline: float | None = None  # this tick's end of waiting (time.monotonic())
        self._tick = 0
        self._say = SaidOnce()

    def tick(self) -> None:
        self._tick += 1
        self._deadline = None
        if self._tick % 60 == 0:
            old = self._tick - CACHE_IDLE_TICKS
            for pid in [p for p, e in self._cache.items() if e.seen < old]:
                del self._cache[pid]
            # reads finished for a process that was gone before its answer was taken
            for pid in [p for p, w in self._pending.items() if w.done.is_set()]:
                del self._pending[pid]

    def resolve(self, pid: int) -> Workload | None:
        start = self._start_time(pid)
        if start is None:
            self._say(
                "hidden",
                "process %d on a GPU is not in %s: the agent sees another PID namespace, or "
                "/proc is mounted with hidepid; its GPU's workloads are not sent (said once)",
                pid,
                self.root,
            )
            return None
        entry = self._cache.get(pid)
        if entry is not None and entry.start == start:
            entry.seen = self._tick
            return entry.workload
        got = self._reads(pid, start)
        if got is None:
            return None
        w, alias = got
        if alias is not None:
            self._claim(w.id, alias)
        if len(self._cache) >= CACHE_MAX:
            # Far more processes than a node runs on its GPUs: forget the least recently seen.
            for p, _ in sorted(self._cache.items(), key=lambda kv: kv[1].seen)[: CACHE_MAX // 4]:
                del self._cache[p]
        self._cache[pid] = _Entry(start, w, self._tick)
        return w

    # -- reading one process, off the tick -----------------------------------------------------

    def _reads(self, pid: int, start: int) -> _Resolved | None:
        """The answer of the reads of process ``pid`` (started at ``start``), begun now or at an
        earlier tick, waiting for it no later than this tick's deadline; ``None`` while it is
        not there (or the process cannot be read)."""
        p = self._pending.get(pid)
        if p is None or (p.start != start and p.done.is_set()):
            if not self._slots.acquire(blocking=False):
                self._say(
                    "busy",
                    "reading /proc of new GPU processes: %d reads have not returned (a process "
                    "whose files never answer); the GPUs of processes not read yet send no "
                    "workloads (said once)",
                    RESOLVE_THREADS,
                )
                return None
            p = self._pending[pid] = _Pending(start, time.monotonic())
            threading.Thread(
                target=self._read_process, args=(pid, p), name=f"gpufleet-proc-{pid}", daemon=True
            ).start()
        elif p.start != start:
            return None  # the pid's earlier process is still being read: its thread is stuck
        now = time.monotonic()
        if self._deadline is None:
            self._deadline = now + self.wait_s
        if not p.done.wait(max(0.0, self._deadline - now)):
            if now - p.since > RESOLVE_STUCK_S:
                self._say(
                    "stuck",
                    "reading /proc/%d has not returned for %.0f s (a file its process controls "
                    "does not answer); its GPU's workloads are not sent meanwhile (said once)",
                    pid,
                    now - p.since,
                )
            return None
        del self._pending[pid]
        return p.result

    def _read_process(self, pid: int, p: _Pending) -> None:
        try:
            p.result = self._resolve(pid)
        except Exception:  # a defect here must cost this process its workload, not the agent
            log.exception("reading /proc/%d failed unexpectedly", pid)
        finally:
            p.done.set()
            self._slots.release()

    def _start_time(self, pid: int) -> int | None:
        """Field 22 of ``/proc/<pid>/stat`` (clock ticks since boot): with the pid, it names a
        process for as long as the node runs."""
        try:
            data = _read(f"{self.root}/{pid}/stat", 4096)
            # the command name (field 2) may hold spaces and ')': split after the last ')'
            return int(data.rsplit(b")", 1)[1].split()[19])
        except (OSError, IndexError, ValueError):
            return None

    def _resolve(self, pid: int) -> _Resolved | None:
        base = f"{self.root}/{pid}"
        try:
            cgroup = _read(f"{base}/cgroup").decode("utf-8", "replace")
            status = _read(f"{base}/status")
        except OSError:
            return None  # gone since its start time was read
        uid = _uid(status)
        if uid is None:
            return None
        user = self._user(uid)
        owner = cgroup_owner(cgroup)
        if owner is None:
            if ":/.." in cgroup:
                self._say(
                    "cgroupns",
                    "process %d's cgroup is outside the agent's cgroup namespace (%s): no job, "
                    "pod or container can be told from such a path, so GPU processes count as "
                    "their users'; run the agent in the host's cgroup namespace (said once)",
                    pid,
                    cgroup.strip()[:200],
                )
            return Workload("user", user, user=user), None
        kind, ident = owner
        if kind == "slurm":
            return self._slurm(pid, ident, user, self._environ(pid))
        if kind == "k8s":
            return self._pod(ident), None
        return Workload("container", ident), None

    def _slurm(self, pid: int, job_id: str, user: str, env: dict[str, str]) -> _Resolved:
        claimed = env.get("SLURM_JOB_ID")
        if claimed is None:
            # not started by this job's slurmstepd (an ssh session adopted into the job by
            # pam_slurm_adopt), or the environment could not be read: the cgroup says it all
            return Workload("slurm", job_id, user=user), None
        if claimed != job_id:
            self._say(
                "other-job",
                "process %d is in Slurm job %s's cgroup but its environment says job %r: "
                "counted as its user %s's, not as either job (said once)",
                pid,
                job_id,
                claimed[:40],
                user,
            )
            return Workload("user", user, user=user), None
        alias = None
        array, task = env.get("SLURM_ARRAY_JOB_ID", ""), env.get("SLURM_ARRAY_TASK_ID", "")
        # an array's job id is given before any of its tasks' own: never above the task's
        if _JOB_NUMBER.fullmatch(array) and _JOB_NUMBER.fullmatch(task):
            if int(array) <= int(job_id):
                alias = f"{int(array)}_{int(task)}"
        name = env.get("SLURM_JOB_NAME") or None
        return Workload("slurm", job_id, user=user, name=name), alias

    def _claim(self, job_id: str, alias: str) -> None:
        """A process of job ``job_id`` says the job is array task ``alias``; two processes of
        the job that say two forms are believed in neither."""
        if job_id in self._refused or self.aliases.get(job_id) == alias:
            return
        if job_id in self.aliases:
            del self.aliases[job_id]
            self._refused.add(job_id)
            self._say(
                f"two-forms-{job_id}",
                "Slurm job %s's processes name two array tasks: it goes by its job id (said once)",
                job_id,
            )
        else:
            if len(self.aliases) >= CACHE_MAX:
                self.aliases.clear()
            self.aliases[job_id] = alias
        if len(self._refused) >= CACHE_MAX:
            self._refused.clear()
        self.aliases_version += 1

    def _pod(self, pod_uid: str) -> Workload:
        """Pod ``pod_uid`` (from its cgroup) as ``namespace/name``, account = the namespace,
        where kubelet's log directory of the pod says them; else by its UID, with no account."""
        names = self._pod_names(pod_uid)
        if names is None:
            return Workload("k8s", pod_uid)
        namespace, name = names
        return Workload("k8s", f"{namespace}/{name}", account=namespace)

    def _pod_names(self, pod_uid: str) -> tuple[str, str] | None:
        """Namespace and name of pod ``pod_uid`` from the one entry ``<namespace>_<name>_<uid>``
        of the pod log root: kubelet makes it, as root, in a root-owned directory that no pod
        can write (a pod allowed hostPath mounts of it, or privileged, is the node's root
        anyway). The pod's own claims (its service-account namespace file, its ``HOSTNAME``)
        are never read: its container can rewrite them."""
        root = self.pod_log_root
        try:
            st = os.stat(root)  # the root may be a link an operator made; its entries may not
            why = _untrusted(st, self.owners) if stat.S_ISDIR(st.st_mode) else "is not a directory"
            if why is None:
                with os.scandir(root) as it:
                    names = [e.name for e in it]
        except OSError as e:
            why = f"cannot be read ({e.strerror or e})"
        if why is not None:
            self._say(
                "pod-root",
                "pod log directory %s %s: Kubernetes pods are sent by their UID, with no account; "
                "give the agent kubelet's pod log directory, read-only (--pod-log-root, "
                "docs/agent.md, said once)",
                root,
                why,
            )
            return None
        suffix = "_" + pod_uid
        found = [n for n in names if n.endswith(suffix)]
        if len(found) != 1:
            # none: a kubelet before 1.14 (it named the directory by the UID alone), or a root
            # that is not kubelet's podLogsDir; several: someone else made one
            self._say(
                f"pod-{pod_uid}" if found else "pod-none",
                "pod %s has %d log directories named <namespace>_<name>_<uid> in %s, not one: it "
                "is sent by its UID, with no account (said once%s)",
                pod_uid,
                len(found),
                root,
                " per pod" if found else "",
            )
            return None
        namespace, _, name = found[0][: -len(suffix)].partition("_")
        try:
            est = os.lstat(os.path.join(root, found[0]))
        except OSError:
            return None  # gone since the listing: the pod ended
        why = _untrusted(est, self.owners) if stat.S_ISDIR(est.st_mode) else "is not a directory"
        if why is None and not (
            _K8S_NAMESPACE.fullmatch(namespace) and _K8S_POD_NAME.fullmatch(name)
        ):
            why = "is not <namespace>_<name>_<uid> as kubelet writes it"
        if why is None:
            return namespace, name
        self._say(
            f"pod-{pod_uid}",
            "pod log directory %s/%s %s: pod %s is sent by its UID, with no account (said once "
            "per pod)",
            root,
            found[0][:300],
            why,
            pod_uid,
        )
        return None

    def _environ(self, pid: int) -> dict[str, str]:
        try:
            data = _read(f"{self.root}/{pid}/environ", _ENV_MAX)
        except PermissionError as e:
            self._say(
                "environ",
                "cannot read /proc/<pid>/environ of other users' processes (%s): Slurm jobs are "
                "sent without the name and array id that their environment holds; run the agent "
                "as root or give it CAP_SYS_PTRACE (docs/agent.md, said once)",
                e,
            )
            return {}
        except OSError:
            return {}
        env: dict[str, str] = {}
        for item in data.split(b"\0"):
            key, _, value = item.partition(b"=")
            if key in _ENV_KEYS:
                env[key.decode()] = value.decode("utf-8", "replace")
        return env

    def _user(self, uid: int) -> str:
        name = self._names.get(uid)
        if name is None:
            if len(self._names) >= CACHE_MAX:
                self._names.clear()
            name = self._names[uid] = self.users(uid)
        return name


def _uid(status: bytes) -> int | None:
    for line in status.splitlines():
        if line.startswith(b"Uid:"):
            try:
                return int(line.split()[1])  # real, effective, saved, filesystem
            except (IndexError, ValueError):
                return None
    return None


# -- allocations --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Allocation:
    """A workload that holds GPUs whether or not a process of it runs on them."""

    workload: Workload
    gpus: tuple[str | int, ...]  # GPU UUIDs, or NVML indexes
    job_id: str | None = None  # Slurm: the numeric job id where ``workload.id`` is ``123_4``
    origin: str = ""  # the file it came from, for the log
    # the job's GPU device files (/dev/nvidiaN), which the agent maps to GPUs by minor number
    devices: tuple[str, ...] = ()


class MinorApi(Protocol):
    """The NVML calls that tell a GPU's device file: ``/dev/nvidia<minor>``."""

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str: ...
    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int: ...


def nvml_minors(api: MinorApi) -> Callable[[Mapping[str, int]], dict[int, str]]:
    """minor number → GPU UUID for a node's GPUs (UUID → NVML index), through NVML's
    ``nvmlDeviceGetMinorNumber``: the number of the GPU's ``/dev/nvidia<N>``, the same as the
    device file's minor number, which Slurm's gres.conf ``File=`` and a job's cgroup name. A
    GPU NVML gives no minor for (a MIG device, an error) has none; asked again only when the
    node's GPUs change (a minor number is fixed while the driver is loaded)."""
    cache: dict[tuple[tuple[str, int], ...], dict[int, str]] = {}

    def minors(gpus: Mapping[str, int]) -> dict[int, str]:
        key = tuple(sorted(gpus.items()))
        got = cache.get(key)
        if got is None:
            got = {}
            for uuid, index in key:
                try:
                    h = api.nvmlDeviceGetHandleByIndex(index)
                    if api.nvmlDeviceGetUUID(h) == uuid:
                        got[int(api.nvmlDeviceGetMinorNumber(h))] = uuid
                except Exception as e:  # pynvml.NVMLError and kin: that GPU has no minor
                    log.info("GPU %s %s: no minor number from NVML (%s)", index, uuid, e)
            cache.clear()
            cache[key] = got
        return got

    return minors


class AllocationSource(Protocol):
    def allocations(self, now: float, gpus: Mapping[str, int]) -> Sequence[Allocation]:
        """The allocations in force at ``now`` on this node's GPUs (``gpus``: UUID → index).
        The same object again while nothing changed."""
        ...


def allocation_parse(data: object, origin: str = "") -> Allocation | str:
    """An allocation file's JSON (docs/agent.md) → the allocation, or why it is not one."""
    if not isinstance(data, dict):
        return "is not a JSON object"
    kind = data.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:  # a list is not even hashable
        return f"kind must be one of {', '.join(sorted(KINDS))}, not {_short(kind)}"
    ident = _ident(data.get("id"))
    if ident is None:
        return "id must be a non-empty string (or a job number)"
    texts: dict[str, str | None] = {}
    for key in ("user", "account", "name"):
        v = data.get(key)
        if v is not None and not isinstance(v, str):
            return f"{key} must be a string"
        texts[key] = v or None
    gpus = data.get("gpus")
    if not isinstance(gpus, list) or not gpus or len(gpus) > ALLOC_MAX_GPUS:
        return f"gpus must be a list of 1 to {ALLOC_MAX_GPUS} GPU UUIDs or indexes"
    parsed: list[str | int] = []
    for g in gpus:
        # an index is a small number or a string of ASCII digits ("²".isdigit() is true, and
        # int() of 5,000 digits raises): anything else is a UUID, or not a GPU at all
        if isinstance(g, int) and not isinstance(g, bool) and 0 <= g <= ALLOC_MAX_INDEX:
            parsed.append(g)
        elif isinstance(g, str) and _INDEX.fullmatch(g.strip()):
            parsed.append(int(g.strip()))
        elif isinstance(g, str) and 0 < len(g.strip()) <= ALLOC_MAX_UUID:
            parsed.append(g.strip())
        else:
            return f"gpus holds {_short(g)}, neither a GPU UUID nor an index"
    job_id = _ident(data.get("job_id"))
    if data.get("job_id") is not None and (job_id is None or not _JOB_NUMBER.fullmatch(job_id)):
        return "job_id must be the numeric Slurm job id"
    devices = data.get("devices")
    if devices is not None and (
        not isinstance(devices, list)
        or not 0 < len(devices) <= ALLOC_MAX_GPUS
        or not all(
            isinstance(d, str) and d.startswith("/") and len(d) <= ALLOC_MAX_PATH for d in devices
        )
    ):
        return f"devices must be a list of 1 to {ALLOC_MAX_GPUS} absolute paths"
    return Allocation(
        Workload(
            str(kind), ident, user=texts["user"], account=texts["account"], name=texts["name"]
        ),
        tuple(dict.fromkeys(parsed)),
        job_id,
        origin,
        tuple(dict.fromkeys(devices or ())),
    )


def _short(v: object) -> str:
    """``v`` for a log line: a hostile file's value is not repeated whole."""
    r = repr(v) if not isinstance(v, (list, dict)) else type(v).__name__
    return r if len(r) <= 60 else r[:57] + "..."


def _ident(v: object) -> str | None:
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 10**12:
        return str(v)
    if isinstance(v, str) and v.strip():
        return v.strip()
    return None


def _gpu_known(g: str | int, gpus: Mapping[str, int]) -> bool:
    if isinstance(g, int):
        return g in gpus.values()
    return g in gpus


# a parsed file, or why it is not an allocation; None: it went away while being read
_Parsed = Allocation | str | None
# what tells one version of a file from another: inode, mtime, size, owner, mode
_FileKey = tuple[int, int, int, int, int]


class AllocationDir:
    """The allocation files of one directory (``*.json``; dot files, such as the hooks' files
    being written, are not read). Looked at no more than once a second; a file is parsed again
    only when its inode, mtime or size changed. A file that is malformed, unreadable or names
    a GPU this node does not have is skipped and logged, once per version of the file.

    The files name who holds a GPU, so only the scheduler's hook may have written them: the
    directory and each file must belong to one of ``owners`` (default: root, and the agent's own
    user) and be writable by nobody else; anything else is skipped and logged. A file is read
    without blocking, at most ``ALLOC_MAX_BYTES``, decoded as UTF-8 with replacement.

    A file's ``devices`` (the job's ``/dev/nvidiaN``, which the Slurm prolog takes from
    gres.conf in Slurm's order) name its GPUs where ``minors`` (minor number → UUID, from
    :func:`nvml_minors`) is given: each file's minor number is NVML's minor number of one GPU.
    Slurm's GPU indexes follow gres.conf, not NVML, so they are used only without devices.

    A problem of the directory (missing, unreadable, not trusted) is logged when it begins and
    when it ends, never each second; :attr:`problem` is the one in force, :attr:`skipped` the
    number of files skipped at the last look, :attr:`problems_total` how many problems of the
    directory or its files were logged since the start (the agent has no metrics endpoint:
    these are its counters)."""

    def __init__(
        self,
        path: str = DEFAULT_ALLOC_DIR,
        *,
        wall: Callable[[], float] = time.time,
        owners: Collection[int] | None = None,
        minors: Callable[[Mapping[str, int]], Mapping[int, str]] | None = None,
    ) -> None:
        self.path = path
        self.owners = _trusted_owners(owners)
        self.minors = minors
        self.problem: str | None = None
        self._problem_level = logging.INFO
        self.skipped = 0
        self.problems_total = 0
        self._wall = wall  # the file system's clock, for ALLOC_RACY_S
        self._looked = -float("inf")
        self._scanned = -float("inf")
        self._dir_key: tuple[int, int] | None = None
        self._gpus: dict[str, int] = {}
        self._files: dict[str, tuple[_FileKey, _Parsed]] = {}
        self._current: tuple[Allocation, ...] = ()
        self._say = SaidOnce()

    def allocations(self, now: float, gpus: Mapping[str, int]) -> Sequence[Allocation]:
        if now - self._looked < 1.0 and gpus == self._gpus:
            return self._current
        self._looked = now
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            # no hook on this node, or no job with GPUs since boot (the prolog creates it)
            self._dir_problem(
                "does not exist: no allocations (the Slurm prolog makes it at the first job "
                "with GPUs; said again when that changes)",
                logging.INFO,
            )
            self._files.clear()
            self._dir_key = None
            self._current = ()
            self.skipped = 0
            return self._current
        except OSError as e:
            self._dir_problem(f"cannot be read ({e.strerror or e}): no allocation is believed")
            self._current = ()
            return self._current
        why = "is not a directory" if not stat.S_ISDIR(st.st_mode) else _untrusted(st, self.owners)
        if why:
            self._dir_problem(f"{why}: no allocation in it is believed")
            self._files.clear()
            self._dir_key = None
            self._current = ()
            self.skipped = 0
            return self._current
        key = (st.st_ino, st.st_mtime_ns)
        racy = self._wall() - st.st_mtime < ALLOC_RACY_S
        if (
            key == self._dir_key
            and not racy
            and gpus == self._gpus
            and now - self._scanned < ALLOC_RESCAN_S
        ):
            return self._current
        self._dir_key, self._gpus, self._scanned = key, dict(gpus), now
        self._scan()
        return self._current

    def _dir_problem(self, why: str | None, level: int = logging.WARNING) -> None:
        """The directory's problem (None: none) at this look: said when it begins or changes,
        and when it ends, not at every look."""
        if why == self.problem:
            return
        if why is not None:
            log.log(level, "allocation directory %s %s", self.path, why)
            self.problems_total += 1
        else:
            log.info("allocation directory %s: read again", self.path)
        self.problem = why
        self._problem_level = level

    def health(self) -> dict[str, Any]:
        """What the agent tells the server about the directory with every push (its node
        header, docs/ingest.md): the problem in force that hides allocations ("" when none; a
        directory not made yet, normal before the first GPU job, is none) and the files skipped
        at the last look. The server shows both on ``/metrics``."""
        problem = self.problem if self._problem_level >= logging.WARNING else None
        text = f"{self.path} {problem}" if problem else ""
        return {"alloc_problem": text[:ALLOC_PROBLEM_MAX], "alloc_skipped_files": self.skipped}

    def _scan(self) -> None:
        try:
            entries = list(os.scandir(self.path))
        except OSError as e:
            self._dir_problem(f"cannot be read ({e.strerror or e}): no allocation is believed")
            self._current = ()
            return
        self._dir_problem(None)
        minors = self.minors(self._gpus) if self.minors is not None else None
        files: dict[str, tuple[_FileKey, _Parsed]] = {}
        found: list[Allocation] = []
        skipped = 0
        for entry in entries:
            name = entry.name
            if name.startswith(".") or not name.endswith(".json"):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # removed since the listing
            fkey = (st.st_ino, st.st_mtime_ns, st.st_size, st.st_uid, st.st_mode)
            old = self._files.get(name)
            parsed: _Parsed
            if old is not None and old[0] == fkey:
                parsed = old[1]
            elif not stat.S_ISREG(st.st_mode):
                parsed = "is not a regular file"
            elif why := _untrusted(st, self.owners):
                parsed = why
            elif st.st_size > ALLOC_MAX_BYTES:
                parsed = f"is {st.st_size} bytes, more than an allocation file holds"
            else:
                parsed = self._parse(name)
            files[name] = (fkey, parsed)
            if parsed is None:
                continue
            if not isinstance(parsed, str):
                parsed = self._by_device(parsed, minors, name, fkey)
            if isinstance(parsed, str):
                self._skip(name, fkey, parsed)
                skipped += 1
                continue
            unknown = [g for g in parsed.gpus if not _gpu_known(g, self._gpus)]
            if unknown:
                listed = ", ".join(map(str, unknown[:4])) + (", …" if len(unknown) > 4 else "")
                self._skip(name, fkey, f"names GPUs this node does not have ({listed})")
                skipped += 1
                continue
            found.append(parsed)
        self._files = files
        self.skipped = skipped
        found.sort(key=lambda a: a.origin)
        current = tuple(found)
        if current != self._current:
            self._current = current

    def _parse(self, name: str) -> _Parsed:
        try:
            raw = _read(os.path.join(self.path, name), ALLOC_MAX_BYTES + 1)
        except FileNotFoundError:
            return None  # the job ended between the listing and the read
        except OSError as e:
            return f"cannot be read ({e.strerror or e})"
        if len(raw) > ALLOC_MAX_BYTES:
            return f"is more than {ALLOC_MAX_BYTES} bytes, more than an allocation file holds"
        try:
            # a name in another encoding is still the job's: its bad bytes become U+FFFD
            data = json.loads(raw.decode("utf-8-sig", "replace"))
        except ValueError as e:  # also int() of a number with thousands of digits
            return f"is not JSON ({e})"
        except RecursionError:
            return "is not JSON (nested too deeply)"
        try:
            return allocation_parse(data, name)
        except Exception as e:  # a file the parser did not foresee must not stop the agent
            log.exception("allocation file %s/%s: unexpected error while parsing", self.path, name)
            return f"is not an allocation ({type(e).__name__})"

    def _by_device(
        self, a: Allocation, minors: Mapping[int, str] | None, name: str, fkey: _FileKey
    ) -> Allocation | str:
        """``a`` with its GPUs named by its device files' minor numbers, where it names device
        files and its GPUs are not UUIDs already (which cannot be misread); or why not."""
        if not a.devices or all(isinstance(g, str) for g in a.gpus):
            return a
        if minors is None:
            self._say(
                ("no-minors", name, *map(str, fkey)),
                "allocation file %s/%s names device files, but this agent has no NVML minor "
                "numbers to map them: its GPU indexes are used (said once per version of the "
                "file)",
                self.path,
                name,
            )
            return a
        uuids: list[str] = []
        for path in a.devices:
            try:
                st = os.stat(path)  # /dev/nvidia0 may be a link to the device
            except OSError as e:
                return f"names device file {_short(path)}, which cannot be read ({e.strerror})"
            if not stat.S_ISCHR(st.st_mode):
                return f"names device file {_short(path)}, which is not a character device"
            uuid = minors.get(os.minor(st.st_rdev))
            if uuid is None:
                return (
                    f"names device file {_short(path)} (minor {os.minor(st.st_rdev)}), "
                    "which is no GPU of this node"
                )
            uuids.append(uuid)
        return dataclasses.replace(a, gpus=tuple(dict.fromkeys(uuids)))

    def _skip(self, name: str, fkey: _FileKey, why: str) -> None:
        if self._say(
            (name, *map(str, fkey), why),
            "allocation file %s/%s %s: skipped (said once per version of the file)",
            self.path,
            name,
            why,
        ):
            self.problems_total += 1


# -- both together ------------------------------------------------------------------------------


class Discovery:
    """Per GPU and second, the workloads holding it: its processes' workloads and the
    allocations naming it, de-duplicated by (kind, id). A Slurm job is reported under one id
    (the array form where one is known, from an allocation file, or from its processes'
    environment where no other job claims the same form), with the user, account and name of
    its allocation file where its process says less. A process of a job whose allocation file
    names another user than the one it runs as is its user's (kind ``user``)."""

    def __init__(
        self, resolver: ProcessResolver, allocations: AllocationSource | None = None
    ) -> None:
        self.resolver = resolver
        self.allocations = allocations
        self._allocs: Sequence[Allocation] = ()
        self._gpus: dict[str, int] = {}
        self._alias_version = -1
        self._aliases: dict[str, str] = {}
        self._meta: dict[tuple[str, str], Workload] = {}
        self._by_gpu: dict[str, tuple[Workload, ...]] = {}
        self._canon: dict[Workload, Workload] = {}
        self._say = SaidOnce()

    def health(self) -> dict[str, Any]:
        """The allocation directory's health for the node header (:meth:`AllocationDir.health`);
        empty for another allocation source or none."""
        return self.allocations.health() if isinstance(self.allocations, AllocationDir) else {}

    def begin(self, now: float, gpus: Mapping[str, int]) -> None:
        """Start a tick at ``now``; ``gpus``: every GPU of the node, UUID → NVML index."""
        self.resolver.tick()
        allocs = self.allocations.allocations(now, gpus) if self.allocations else ()
        if (
            allocs is not self._allocs
            or gpus != self._gpus
            or self.resolver.aliases_version != self._alias_version
        ):
            self._rebuild(allocs, gpus)

    def holders(self, uuid: str, pids: Iterable[int]) -> tuple[Workload, ...] | None:
        """The workloads holding GPU ``uuid`` in this second, its processes being ``pids``."""
        resolved: list[Workload] = []
        for pid in pids:
            w = self.resolver.resolve(pid)
            if w is None:
                return None
            resolved.append(w)
        if self.resolver.aliases_version != self._alias_version:
            # a process just said that its job is an array task: from now on (this GPU too)
            # the job goes by that id, and so does its allocation
            self._rebuild(self._allocs, self._gpus)
        found: dict[tuple[str, str], Workload] = {}
        for w in resolved:
            c = self.canonical(w)
            if c.kind == "slurm" and w.user and c.user != w.user:
                # the job's allocation file (root's) names another user than the process runs
                # as: the two do not agree on whose it is, so it is its uid's
                self._say(
                    f"user-{c.id}",
                    "a process running as %s is in Slurm job %s, whose allocation file names "
                    "user %s: counted as %s's, not the job's (said once per job)",
                    w.user,
                    c.id,
                    c.user,
                    w.user,
                )
                c = Workload("user", w.user, user=w.user)
            found.setdefault((c.kind, c.id), c)
        for w in self._by_gpu.get(uuid, ()):
            found.setdefault((w.kind, w.id), w)
        return tuple(found.values())

    def canonical(self, w: Workload) -> Workload:
        c = self._canon.get(w)
        if c is None:
            c = self._canonical(w)
            if len(self._canon) >= CACHE_MAX:
                self._canon.clear()
            self._canon[w] = c
        return c

    def _canonical(self, w: Workload) -> Workload:
        ident = self._aliases.get(w.id, w.id) if w.kind == "slurm" else w.id
        m = self._meta.get((w.kind, ident))
        if m is None:
            return w if ident == w.id else Workload(w.kind, ident, w.user, w.account, w.name)
        return Workload(
            w.kind,
            ident,
            user=m.user or w.user,
            account=m.account or w.account,
            name=m.name or w.name,
        )

    def _rebuild(self, allocs: Sequence[Allocation], gpus: Mapping[str, int]) -> None:
        self._allocs, self._gpus = allocs, dict(gpus)
        self._alias_version = self.resolver.aliases_version
        self._aliases = self._vetted_aliases(allocs)
        self._meta = {}
        self._canon.clear()
        meta: dict[tuple[str, str], Workload] = {}
        for a in allocs:
            w = self._canonical(a.workload)
            meta.setdefault((w.kind, w.id), w)
        self._meta = meta
        by_index = {i: u for u, i in gpus.items()}
        by_gpu: dict[str, dict[tuple[str, str], Workload]] = {}
        for a in allocs:
            w = self.canonical(a.workload)
            for g in a.gpus:
                uuid = by_index.get(g) if isinstance(g, int) else g
                if uuid is not None and uuid in gpus:
                    by_gpu.setdefault(uuid, {}).setdefault((w.kind, w.id), w)
        self._by_gpu = {u: tuple(d.values()) for u, d in by_gpu.items()}

    def _vetted_aliases(self, allocs: Sequence[Allocation]) -> dict[str, str]:
        """Numeric job id → array form: an allocation file's (root's hook wrote it), then each
        claim of a job's own processes that neither such a file nor another job's processes
        contradict. A claim another job also makes is believed for neither: a job's user can
        name any array task, not prove it is theirs."""
        aliases: dict[str, str] = {}
        taken: set[str] = set()  # array forms the allocation files give
        for a in allocs:
            if a.workload.kind != "slurm":
                continue
            taken.add(a.workload.id)
            if a.job_id and a.job_id != a.workload.id:
                aliases.setdefault(a.job_id, a.workload.id)
        claims: dict[str, list[str]] = {}
        for job, form in self.resolver.aliases.items():
            if job not in aliases:
                claims.setdefault(form, []).append(job)
        for form, jobs in claims.items():
            if len(jobs) == 1 and form not in taken:
                aliases[jobs[0]] = form
            else:
                self._say(
                    f"alias-{form}",
                    "Slurm jobs %s each say they are array task %s (or an allocation file "
                    "gives it to another job): believed for none of them, which go by their "
                    "job ids (said once)",
                    ", ".join(sorted(jobs)),
                    form,
                )
        return aliases
