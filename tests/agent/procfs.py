"""A fake ``/proc`` for the workload tests, and ``/proc/<pid>/cgroup`` files as each runtime and
cgroup version writes them.

Every cgroup file below is written out whole, as the kernel shows it for a process of that
runtime (cgroup v1: one line per hierarchy, ``id:controllers:path``; v2: the one line
``0::path``), from these public sources:

* Slurm, cgroup v1: Slurm's Cgroups Guide, "Organization of Slurm Cgroups"
  (SchedMD/slurm doc/html/cgroups.shtml, https://slurm.schedmd.com/cgroups.html): a task's
  cgroup is ``<controller>/slurm/uid_<uid>/job_<jobid>/step_<stepid>/task_<taskid>``;
  proctrack/cgroup keeps the step in the freezer hierarchy, task/cgroup the task in memory and
  devices.
* Slurm, cgroup v2: Slurm's "Control Group v2 plugin", "Hierarchy overview" (SchedMD/slurm
  doc/html/cgroup_v2.shtml, https://slurm.schedmd.com/cgroup_v2.html): slurmd's scope
  ``/system.slice/slurmstepd.scope`` holds ``job_<id>/step_<step>/user/task_<n>``, steps named
  ``step_0``, ``step_batch``, ``step_extern``, ``step_interactive`` (the scope is
  ``<node>_slurmstepd.scope`` with --enable-multiple-slurmd).
* Slurm job arrays: Slurm's "Job Array Support" (doc/html/job_array.shtml): every task is a
  job with its own ``SLURM_JOB_ID`` (so its cgroup is ``job_<that id>``), and
  ``SLURM_ARRAY_JOB_ID``, ``SLURM_ARRAY_TASK_ID`` in its environment; "37" and "36_2" name the
  same task.
* Kubernetes: kubelet names a pod's cgroup ``pod<uid>`` under its QoS class
  (kubernetes/kubernetes pkg/kubelet/cm/pod_container_manager_linux.go,
  ``podCgroupNamePrefix = "pod"``); the systemd driver turns ``/kubepods/burstable/pod<uid>``
  into nested slices, writing each '-' of a name as '_'
  (pkg/kubelet/cm/cgroup_manager_linux.go, ``ConvertCgroupNameToSystemd``):
  ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_>.slice``.
* Container ids as runtimes write them, from Falco's tests of real cgroups
  (falcosecurity/libs test/libsinsp_e2e/container/container_cgroup.cpp, and the layouts of
  userspace/libsinsp/cri.cpp): containerd under cgroupfs ``/kubepods/besteffort/pod<uid>/<id>``,
  containerd with SystemdCgroup ``cri-containerd-<id>.scope``, containerd's v1
  ``name=systemd`` line ``kubepods-burstable-pod<32-hex static pod uid>.slice:cri-containerd:<id>``,
  CRI-O ``crio-<id>.scope`` (cri-o internal/config/cgmgr, ``CrioPrefix = "crio"``) and
  ``/kubepods/besteffort/pod<uid>/crio-<id>``, Docker ``/docker/<id>`` (cgroupfs) and
  ``docker-<id>.scope`` under ``system.slice`` (moby cmd/dockerd, ``newCgroupParent``: parent
  ``system.slice`` with the systemd driver, ``docker`` otherwise).
* A pod's names on the host: kubelet makes one log directory per pod,
  ``<podLogsDir>/<namespace>_<name>_<uid>`` (kubernetes/kubernetes
  pkg/kubelet/kuberuntime/helpers.go, ``BuildPodLogsDirectory``, ``logPathDelimiter = "_"``),
  with ``MkdirAll(…, 0755)`` in ``createPodSandbox`` (kuberuntime_sandbox.go) before the pod's
  sandbox and containers start; ``podLogsDir`` is ``/var/log/pods`` by default. Each container's
  logs are ``<container>/<restart count>.log`` inside it. What the container itself could
  rewrite: its service-account ``namespace`` file (a projected volume the pod's author defines,
  the file inside the container's own root) and ``HOSTNAME`` (its environment; a pod's
  ``spec.hostname`` sets it too), and the host's ``<kubelet root>/pods/<uid>/etc-hosts``, which
  kubelet bind-mounts as the container's ``/etc/hosts`` with ``ReadOnly: false``
  (kubelet_pods.go, ``makeHostsMount``).
* A login session: systemd's ``/user.slice/user-<uid>.slice/session-<n>.scope``.
* What a user can name: systemd delegates ``/user.slice/user-<uid>.slice/user@<uid>.service``
  to the user's own manager (systemd.resource-control(5), ``Delegate=``; "Control Group APIs
  and Delegation", systemd.io/CGROUP_DELEGATION), where ``systemd-run --user --scope`` or a
  plain ``mkdir`` makes cgroups of any name, ``job_4242`` or ``kubepods.slice`` included, and
  moves the user's processes into them.
"""

from __future__ import annotations

from pathlib import Path

POD_UID = "1b7c3d2e-9f4a-4c1b-8e2d-5a6b7c8d9e0f"
POD_UID_ = POD_UID.replace("-", "_")
STATIC_POD_UID = "bd12dd3393227d950605a2444b13c27a"  # a static pod: the hash of its manifest
CID = "7951fb549ab99e0722a949b6c121634e1f3a36b5bacbe5392991e3b12251e6b8"
CID2 = "17d8c9eacc629f9945f304d89e9708c0c619649a484a215b240628319548a09f"

# Slurm, cgroup v1 (task/cgroup + proctrack/cgroup), job 48213 step 0 of uid 1000
SLURM_V1 = """\
12:pids:/system.slice/slurmd.service
11:memory:/slurm/uid_1000/job_48213/step_0/task_0
10:devices:/slurm/uid_1000/job_48213/step_0/task_0
9:freezer:/slurm/uid_1000/job_48213/step_0
8:cpuset:/slurm/uid_1000/job_48213/step_0
7:cpu,cpuacct:/system.slice/slurmd.service
6:blkio:/system.slice/slurmd.service
5:net_cls,net_prio:/
4:hugetlb:/
3:perf_event:/
2:rdma:/
1:name=systemd:/system.slice/slurmd.service
0::/system.slice/slurmd.service
"""
# Slurm, cgroup v2: the batch step of job 48213, and step 0 of an array task (job 1127 = 1123_4)
SLURM_V2 = "0::/system.slice/slurmstepd.scope/job_48213/step_batch/user/task_0\n"
SLURM_V2_ARRAY = "0::/system.slice/slurmstepd.scope/job_1127/step_0/user/task_0\n"
SLURM_V2_EXTERN = "0::/system.slice/slurmstepd.scope/job_48214/step_extern/user/task_0\n"
# Kubernetes, systemd driver, cgroup v2, containerd (SystemdCgroup = true), a Burstable pod
K8S_SYSTEMD = (
    f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_UID_}.slice/"
    f"cri-containerd-{CID}.scope\n"
)
# Kubernetes, cgroupfs driver, cgroup v1, containerd, a BestEffort pod
K8S_CGROUPFS = "".join(
    f"{i}:{c}:/kubepods/besteffort/pod{POD_UID}/{CID}\n"
    for i, c in ((11, "memory"), (10, "devices"), (9, "freezer"), (7, "cpu,cpuacct"))
) + (f"1:name=systemd:/kubepods/besteffort/pod{POD_UID}/{CID}\n")
# Kubernetes, a Guaranteed pod (no QoS level in the path), CRI-O, systemd driver, cgroup v2
K8S_CRIO = f"0::/kubepods.slice/kubepods-pod{POD_UID_}.slice/crio-{CID2}.scope\n"
# containerd without SystemdCgroup on a hybrid v1 node: the name=systemd line, a static pod
K8S_CONTAINERD_V1_SYSTEMD = (
    f"4:memory:/kubepods/burstable/pod{STATIC_POD_UID}/{CID}\n"
    f"1:name=systemd:/system.slice/containerd.service/kubepods-burstable-pod{STATIC_POD_UID}"
    f".slice:cri-containerd:{CID}\n"
)
# Docker, cgroupfs driver, cgroup v1
DOCKER_V1 = "".join(
    f"{i}:{c}:/docker/{CID}\n" for i, c in ((11, "memory"), (10, "devices"), (7, "cpu,cpuacct"))
) + (f"1:name=systemd:/docker/{CID}\n")
# Docker, systemd driver, cgroup v2
DOCKER_V2 = f"0::/system.slice/docker-{CID}.scope\n"
# containerd without Kubernetes (nerdctl), cgroupfs: /<containerd namespace>/<id>
CONTAINERD_PLAIN = f"0::/default/{CID2}\n"
# CRI-O's own scope, without a pod cgroup around it (a container crictl started alone)
CRIO_SCOPE = f"0::/system.slice/crio-{CID2}.scope\n"
# a login session (cgroup v2), and the same user's process on cgroup v1
USER_V2 = "0::/user.slice/user-1001.slice/session-4.scope\n"
USER_V1 = "4:memory:/user.slice/user-1001.slice/session-4.scope\n1:name=systemd:/user.slice\n"

# Cgroups bob (uid 1001) makes in his delegated subtree, named like those of slurmd, kubelet
# and the container runtimes; and a path as an agent in another cgroup namespace sees it (no
# position to tell from).
_BOB = "/user.slice/user-1001.slice/user@1001.service/app.slice"
FORGED = {
    "a job": f"0::{_BOB}/job_4242\n",
    "slurmd's v2 scope": f"0::{_BOB}/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n",
    "slurmd's v1 tree": f"4:memory:{_BOB}/slurm/uid_1000/job_4242/step_0\n1:name=systemd:/\n",
    "a systemd-driver pod": (
        f"0::{_BOB}/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_UID_}.slice\n"
    ),
    "a cgroupfs pod": f"0::{_BOB}/kubepods/besteffort/pod{POD_UID}/{CID}\n",
    "a Docker scope": f"0::{_BOB}/docker-{CID}.scope\n",
    "a CRI-O scope": f"0::{_BOB}/crio-{CID2}.scope\n",
    "another cgroup namespace": f"0::/../../kubepods/pod{POD_UID}/{CID}\n",
}

USERS = {0: "root", 1000: "alice", 1001: "bob", 1002: "carol"}


def user_name(uid: int) -> str:
    return USERS.get(uid, str(uid))


def _stat_line(pid: int, start: int, comm: str) -> str:
    # the fields of a real /proc/<pid>/stat; field 22 (starttime) is what the agent reads
    return (
        f"{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194560 18000 0 12 0 4000 900 0 0 20 0 48 0 "
        f"{start} 41287651328 1900000 18446744073709551615 1 1 0 0 0 0 0 16781312 17642 0 0 0 "
        "17 3 0 0 0 0 0\n"
    )


class FakeProc:
    """A ``/proc`` tree in a directory: a few files per process, as the agent reads them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def add(
        self,
        pid: int,
        cgroup: str,
        *,
        uid: int = 1000,
        start: int = 50_000,
        env: dict[str, str] | None = None,
        namespace: str | None = None,
        comm: str = "python3",
    ) -> Path:
        """A process: its cgroup file, ``status`` (Uid), ``stat`` (start time), ``environ``, and,
        with ``namespace``, a container root holding the service-account namespace file behind
        Debian's ``/var/run -> /run`` symlink: a pod's own claim, which the agent must not read
        (its names are kubelet's, :class:`FakePodLogs`)."""
        d = self.root / str(pid)
        d.mkdir(parents=True, exist_ok=True)
        (d / "cgroup").write_text(cgroup)
        (d / "stat").write_text(_stat_line(pid, start, comm))
        (d / "status").write_text(
            f"Name:\t{comm[:15]}\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{pid}\n"
            f"Pid:\t{pid}\nPPid:\t1\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
            f"Gid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
        )
        environ = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", **(env or {})}
        (d / "environ").write_bytes(
            b"".join(f"{k}={v}".encode() + b"\0" for k, v in environ.items())
        )
        if namespace is not None:
            sa = d / "root" / "run" / "secrets" / "kubernetes.io" / "serviceaccount"
            sa.mkdir(parents=True)
            (sa / "namespace").write_text(namespace)
            (d / "root" / "var").mkdir()
            (d / "root" / "var" / "run").symlink_to("/run")
        return d

    def remove(self, pid: int) -> None:
        import shutil

        shutil.rmtree(self.root / str(pid))


class FakePodLogs:
    """kubelet's pod log directory (``/var/log/pods``) in a directory: one entry per pod."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        root.chmod(0o755)  # whatever the umask, as on a node

    def add(self, namespace: str, name: str, uid: str = POD_UID, container: str = "main") -> Path:
        """The pod's directory, as kubelet names it, with its container's first log file."""
        d = self.root / f"{namespace}_{name}_{uid}"
        (d / container).mkdir(parents=True)
        d.chmod(0o755)  # kubelet's MkdirAll(…, 0755)
        (d / container / "0.log").write_text("")
        return d
