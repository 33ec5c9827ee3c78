"""Who holds a GPU (docs/agent.md): processes mapped to their workloads through ``/proc``, and
allocations that a scheduler hook writes into a directory.

Each second the NVML collector lists the processes on each GPU and asks :class:`Discovery`
which workloads hold it: the workload of each process (:class:`ProcResolver`) and every
allocation that names the GPU (:class:`AllocationDir`), de-duplicated by (kind, id). The answer
is ``None`` when it cannot tell (a process it cannot see), ``()`` when nothing holds the GPU.

A process belongs to the first of these that its ``/proc/<pid>/cgroup`` names (any line, so
cgroup v1's per-controller lines and v2's single line alike):

* a Slurm job: a ``job_<id>`` segment. Slurm names the job's cgroup by its numeric job id, also
  for an array task (each task is a job of its own): ``/slurm/uid_1000/job_48213/step_0/task_0``
  (v1), ``/system.slice/slurmstepd.scope/job_48213/step_batch/user/task_0`` (v2). The array form
  ``123_4`` comes from the process's environment (``SLURM_ARRAY_JOB_ID``, ``SLURM_ARRAY_TASK_ID``)
  where the agent may read it, or from an allocation file that says so (``job_id``);
* a Kubernetes pod: a ``pod<uid>`` segment, ``kubepods-burstable-pod<uid with _>.slice`` under
  the systemd driver, ``/kubepods/burstable/pod<uid>/`` under cgroupfs. Its id is
  ``namespace/pod`` from the service-account namespace file mounted in the process's root and
  the ``HOSTNAME`` of its environment (the pod's name), where the agent may read both; else the
  pod UID;
* a container: a 64-hex id (``/docker/<id>``, ``docker-<id>.scope``, ``cri-containerd-<id>.scope``,
  ``crio-<id>.scope``, ``…:cri-containerd:<id>``);
* else the process's user (``/proc/<pid>/status`` real Uid, its name, or the number where the
  name is unknown).

A pid is resolved once: the answer is kept with the process's start time
(``/proc/<pid>/stat``), read again every second, so a pid reused by another process is resolved
again. Entries for pids not seen for a while are dropped.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import re
import stat
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from .source import Workload

log = logging.getLogger("gpufleet.agent")

DEFAULT_PROC_ROOT = "/proc"
DEFAULT_ALLOC_DIR = "/run/gpufleet/alloc"

KINDS = frozenset({"slurm", "k8s", "container", "user"})

# cgroup path segments (see the module docstring; the formats are written out, with their
# sources, in tests/agent/test_agent_workloads.py)
_SLURM_JOB = re.compile(r"^job_(\d+)$")
_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
# a static pod's UID is a 32-hex hash of its manifest, without dashes
_POD = re.compile(rf"(?:^|-)pod({_UID}|[0-9a-f]{{32}})(?:\.slice)?(?::|$)")
_CONTAINER = re.compile(r"(?:^|[-:])([0-9a-f]{64})(?:\.scope)?$")

# Where Kubernetes mounts the service account in every container that has one; /var/run is a
# symlink to /run in most images, resolved inside the container's root (see _read_in_root).
_NAMESPACE_FILE = "var/run/secrets/kubernetes.io/serviceaccount/namespace"
_ENV_KEYS = frozenset(
    {
        b"HOSTNAME",
        b"SLURM_JOB_ID",
        b"SLURM_ARRAY_JOB_ID",
        b"SLURM_ARRAY_TASK_ID",
        b"SLURM_JOB_USER",
        b"SLURM_JOB_ACCOUNT",
        b"SLURM_JOB_NAME",
    }
)
# /proc/<pid>/environ is the environment the process started with, usually a few KiB
_ENV_MAX = 1 << 20

# A pid's entry is dropped once it has not been on a GPU for this many ticks; the cache never
# holds more than this many entries (a node runs far fewer GPU processes at once).
CACHE_IDLE_TICKS = 120
CACHE_MAX = 4096

# An allocation file is a few hundred bytes; anything far larger is not one.
ALLOC_MAX_BYTES = 64 * 1024
# The directory's mtime tells when a file was added, removed or renamed into it (the hooks
# rename a complete file into place). A change within the same mtime tick as the last look is
# caught by looking again while the mtime is this recent; a file rewritten in place without a
# rename, by the full rescan every ALLOC_RESCAN_S.
ALLOC_RACY_S = 2.0
ALLOC_RESCAN_S = 10.0


def cgroup_owner(text: str) -> tuple[str, str] | None:
    """``(kind, id)`` of what a process's ``/proc/<pid>/cgroup`` places it in: a Slurm job
    (``slurm``, job id), a Kubernetes pod (``k8s``, pod UID) or a container (``container``, its
    64-hex id), in that order of precedence; ``None`` for a plain process."""
    job = pod = container = None
    for line in text.splitlines():
        # "hierarchy-id:controllers:path"; the path itself may hold ':' (":cri-containerd:")
        for seg in line.split(":", 2)[-1].split("/"):
            if job is None and (m := _SLURM_JOB.match(seg)):
                job = m.group(1)
            elif pod is None and (m := _POD.search(seg)):
                pod = m.group(1).replace("_", "-")  # the systemd driver writes '-' as '_'
            elif container is None and (m := _CONTAINER.search(seg)):
                container = m.group(1)
    if job is not None:
        return "slurm", job
    if pod is not None:
        return "k8s", pod
    if container is not None:
        return "container", container
    return None


def _read(path: str, limit: int = 65536) -> bytes:
    with open(path, "rb") as f:
        return f.read(limit)


def _read_in_root(root: str, rel: str) -> bytes:
    """Read ``rel`` inside a process's root directory (``/proc/<pid>/root``), following the
    symlinks on the way inside that root: the kernel would resolve an absolute link such as
    ``/var/run -> /run`` against the agent's own root and read the host's file (or the agent's
    own pod's, where the agent runs in one)."""
    todo = [p for p in rel.split("/") if p]
    done: list[str] = []
    hops = 0
    while todo:
        part = todo.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        if part == ".":
            continue
        path = os.path.join(root, *done, part)
        if os.path.islink(path):
            hops += 1
            if hops > 8:
                raise OSError(f"too many symlinks under {root}")
            target = os.readlink(path)
            if target.startswith("/"):
                done = []
            todo = [p for p in target.split("/") if p] + todo
            continue
        done.append(part)
    return _read(os.path.join(root, *done), 4096)


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


class ProcessResolver(Protocol):
    """Process id → the workload it belongs to (``None``: the process cannot be seen)."""

    # Slurm numeric job id → the array form ``<array job>_<task>`` learnt so far, and a
    # counter that moves whenever that map grows.
    aliases: dict[str, str]
    aliases_version: int

    def resolve(self, pid: int) -> Workload | None: ...

    def tick(self) -> None:
        """Once per agent tick, before the pids of that tick are resolved."""
        ...


class ProcResolver:
    """Resolves process ids through a ``/proc`` tree (``proc_root``: the host's, or a fake one
    in tests). ``users`` maps a uid to a name (default: the node's passwd); ``hostname`` is the
    node's, to tell a host-network pod (whose ``HOSTNAME`` is the node's) from a named one."""

    def __init__(
        self,
        proc_root: str = DEFAULT_PROC_ROOT,
        *,
        users: Callable[[int], str] = user_name,
        hostname: str | None = None,
    ) -> None:
        self.root = proc_root.rstrip("/") or "/"
        self.users = users
        self.hostname = hostname
        self.aliases: dict[str, str] = {}
        self.aliases_version = 0
        self._cache: dict[int, _Entry] = {}
        self._names: dict[int, str] = {}
        self._tick = 0
        self._said: set[str] = set()

    def tick(self) -> None:
        self._tick += 1
        if self._tick % 60 == 0:
            old = self._tick - CACHE_IDLE_TICKS
            for pid in [p for p, e in self._cache.items() if e.seen < old]:
                del self._cache[pid]

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
        w = self._resolve(pid)
        if w is None:
            return None
        if len(self._cache) >= CACHE_MAX:
            # Far more processes than a node runs on its GPUs: forget the least recently seen.
            for p, _ in sorted(self._cache.items(), key=lambda kv: kv[1].seen)[: CACHE_MAX // 4]:
                del self._cache[p]
        self._cache[pid] = _Entry(start, w, self._tick)
        return w

    # -- reading one process ----------------------------------------------------------------

    def _start_time(self, pid: int) -> int | None:
        """Field 22 of ``/proc/<pid>/stat`` (clock ticks since boot): with the pid, it names a
        process for as long as the node runs."""
        try:
            data = _read(f"{self.root}/{pid}/stat", 4096)
            # the command name (field 2) may hold spaces and ')': split after the last ')'
            return int(data.rsplit(b")", 1)[1].split()[19])
        except (OSError, IndexError, ValueError):
            return None

    def _resolve(self, pid: int) -> Workload | None:
        base = f"{self.root}/{pid}"
        try:
            cgroup = _read(f"{base}/cgroup").decode("utf-8", "replace")
            status = _read(f"{base}/status")
        except OSError:
            return None  # gone since its start time was read
        uid = _uid(status)
        user = self._user(uid) if uid is not None else None
        owner = cgroup_owner(cgroup)
        if owner is None:
            if user is None:
                return None
            return Workload("user", user, user=user)
        kind, ident = owner
        env = self._environ(pid)
        if kind == "slurm":
            return self._slurm(ident, user, env)
        if kind == "k8s":
            return self._pod(pid, ident, env)
        return Workload("container", ident)

    def _slurm(self, job_id: str, user: str | None, env: dict[str, str]) -> Workload:
        if env.get("SLURM_JOB_ID") != job_id:
            # not started by this job's slurmstepd (an ssh session adopted into the job by
            # pam_slurm_adopt), or the environment could not be read: the cgroup says it all
            return Workload("slurm", job_id, user=user)
        ident = job_id
        array, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
        if array and task and array.isdigit() and task.isdigit():
            ident = f"{array}_{task}"
            if self.aliases.get(job_id) != ident:
                if len(self.aliases) >= CACHE_MAX:
                    self.aliases.clear()
                self.aliases[job_id] = ident
                self.aliases_version += 1
        return Workload(
            "slurm",
            ident,
            user=env.get("SLURM_JOB_USER") or user,
            account=env.get("SLURM_JOB_ACCOUNT") or None,
            name=env.get("SLURM_JOB_NAME") or None,
        )

    def _pod(self, pid: int, pod_uid: str, env: dict[str, str]) -> Workload:
        namespace: str | None = None
        try:
            namespace = _read_in_root(f"{self.root}/{pid}/root", _NAMESPACE_FILE).decode().strip()
        except FileNotFoundError:
            pass  # a pod without a service account token (automountServiceAccountToken: false)
        except (OSError, UnicodeDecodeError) as e:
            self._denied("root", e)
        pod = env.get("HOSTNAME")
        if pod and self.hostname and pod == self.hostname:
            pod = None  # a host-network pod: its HOSTNAME is the node's, not the pod's name
        if namespace and pod:
            return Workload("k8s", f"{namespace}/{pod}", account=namespace)
        return Workload("k8s", pod_uid, account=namespace or None)

    def _environ(self, pid: int) -> dict[str, str]:
        try:
            data = _read(f"{self.root}/{pid}/environ", _ENV_MAX)
        except PermissionError as e:
            self._denied("environ", e)
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
            name = self._names[uid] = self.users(uid)
        return name

    def _denied(self, what: str, e: BaseException) -> None:
        self._say(
            what,
            "cannot read /proc/<pid>/%s of other users' processes (%s): Kubernetes pods are "
            "sent by their UID, and Slurm jobs without the name, account and array id that "
            "their environment holds; run the agent as root or give it CAP_SYS_PTRACE "
            "(docs/agent.md, said once)",
            what,
            e,
        )

    def _say(self, key: str, message: str, *args: object) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning(message, *args)


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
    if kind not in KINDS:
        return f"kind must be one of {', '.join(sorted(KINDS))}, not {kind!r}"
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
    if not isinstance(gpus, list) or not gpus:
        return "gpus must be a non-empty list of GPU UUIDs or indexes"
    parsed: list[str | int] = []
    for g in gpus:
        if isinstance(g, int) and not isinstance(g, bool) and g >= 0:
            parsed.append(g)
        elif isinstance(g, str) and g.strip().isdigit():
            parsed.append(int(g.strip()))
        elif isinstance(g, str) and g.strip():
            parsed.append(g.strip())
        else:
            return f"gpus holds {g!r}, neither a GPU UUID nor an index"
    job_id = _ident(data.get("job_id"))
    if data.get("job_id") is not None and (job_id is None or not job_id.isdigit()):
        return "job_id must be the numeric Slurm job id"
    return Allocation(
        Workload(
            str(kind), ident, user=texts["user"], account=texts["account"], name=texts["name"]
        ),
        tuple(dict.fromkeys(parsed)),
        job_id,
        origin,
    )


def _ident(v: object) -> str | None:
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
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


class AllocationDir:
    """The allocation files of one directory (``*.json``; dot files, such as the hooks' files
    being written, are not read). Looked at no more than once a second; a file is parsed again
    only when its inode, mtime or size changed. A file that is malformed, unreadable or names
    a GPU this node does not have is skipped and logged, once per version of the file."""

    def __init__(self, path: str = DEFAULT_ALLOC_DIR, *, wall: Callable[[], float] = time.time):
        self.path = path
        self._wall = wall  # the file system's clock, for ALLOC_RACY_S
        self._looked = -float("inf")
        self._scanned = -float("inf")
        self._dir_key: tuple[int, int] | None = None
        self._gpus: dict[str, int] = {}
        self._files: dict[str, tuple[tuple[int, int, int], _Parsed]] = {}
        self._current: tuple[Allocation, ...] = ()
        self._said: set[tuple[str, ...]] = set()

    def allocations(self, now: float, gpus: Mapping[str, int]) -> Sequence[Allocation]:
        if now - self._looked < 1.0 and gpus == self._gpus:
            return self._current
        self._looked = now
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            # no hook on this node (or no job since boot: the hooks create it)
            self._files.clear()
            self._dir_key = None
            self._current = ()
            return self._current
        except OSError as e:
            self._say(("dir", str(e)), "allocation directory %s cannot be read (%s)", self.path, e)
            self._current = ()
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

    def _scan(self) -> None:
        try:
            entries = list(os.scandir(self.path))
        except OSError as e:
            self._say(("dir", str(e)), "allocation directory %s cannot be read (%s)", self.path, e)
            self._current = ()
            return
        files: dict[str, tuple[tuple[int, int, int], _Parsed]] = {}
        found: list[Allocation] = []
        for entry in entries:
            name = entry.name
            if name.startswith(".") or not name.endswith(".json"):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # removed since the listing
            fkey = (st.st_ino, st.st_mtime_ns, st.st_size)
            old = self._files.get(name)
            parsed: _Parsed
            if old is not None and old[0] == fkey:
                parsed = old[1]
            elif not stat.S_ISREG(st.st_mode):
                parsed = "is not a regular file"
            elif st.st_size > ALLOC_MAX_BYTES:
                parsed = f"is {st.st_size} bytes, more than an allocation file holds"
            else:
                parsed = self._parse(name)
            files[name] = (fkey, parsed)
            if parsed is None:
                continue
            if isinstance(parsed, str):
                self._skip(name, fkey, parsed)
                continue
            unknown = [g for g in parsed.gpus if not _gpu_known(g, self._gpus)]
            if unknown:
                listed = ", ".join(map(str, unknown))
                self._skip(name, fkey, f"names GPUs this node does not have ({listed})")
                continue
            found.append(parsed)
        self._files = files
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
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            return f"is not JSON ({e})"
        return allocation_parse(data, name)

    def _skip(self, name: str, fkey: tuple[int, int, int], why: str) -> None:
        self._say(
            (name, *map(str, fkey), why),
            "allocation file %s/%s %s: skipped (said once per version of the file)",
            self.path,
            name,
            why,
        )

    def _say(self, key: tuple[str, ...], message: str, *args: object) -> None:
        if key not in self._said:
            if len(self._said) > 10_000:
                self._said.clear()
            self._said.add(key)
            log.warning(message, *args)


# -- both together ------------------------------------------------------------------------------


class Discovery:
    """Per GPU and second, the workloads holding it: its processes' workloads and the
    allocations naming it, de-duplicated by (kind, id). A Slurm job is reported under one id
    (the array form where one is known, from a process's environment or an allocation file),
    with the user, account and name of its allocation file where its process says less."""

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
        aliases = {
            a.job_id: a.workload.id
            for a in allocs
            if a.workload.kind == "slurm" and a.job_id and a.job_id != a.workload.id
        }
        aliases.update(self.resolver.aliases)
        self._aliases = aliases
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
