"""``gpufleet-agent``: the command line (docs/agent.md).

    gpufleet-agent --server URL --token TOKEN [--interval 60] [--spool DIR]
                   [--once --print] [--fake SPEC] [--source nvml|dcgm] [--dcgm-url URL]
                   [--alloc-dir DIR] [--proc-root DIR] [--pod-log-root DIR]
    gpufleet-agent --queue slurm|k8s --cluster NAME [--squeue PATH | --slurmrestd URL
                   --jwt-file F] [--queue-interval 60]   (queue pressure, see queue.py)

Environment variables stand in for the flags: GPUFLEET_SERVER, GPUFLEET_TOKEN,
GPUFLEET_INTERVAL, GPUFLEET_SPOOL, GPUFLEET_FAKE, GPUFLEET_SOURCE, GPUFLEET_DCGM_URL,
GPUFLEET_ALLOC_DIR, GPUFLEET_PROC_ROOT, GPUFLEET_POD_LOG_ROOT, GPUFLEET_QUEUE,
GPUFLEET_CLUSTER, GPUFLEET_SQUEUE, GPUFLEET_SLURMRESTD, GPUFLEET_JWT_FILE,
GPUFLEET_QUEUE_INTERVAL (and GPUFLEET_HOSTNAME, GPUFLEET_LOG_LEVEL).
For tests and demos of the fake fleet: GPUFLEET_FAKE_SEED, GPUFLEET_FAKE_SPEED (simulated
seconds per real second) and GPUFLEET_FAKE_EPOCH (Unix seconds or ISO time anchoring
the fleet's relative fault times and the sped-up clock).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

from . import __version__
from .agent import Agent
from .clock import Clock, RealClock, ScaledClock, VirtualClock
from .dcgm import DEFAULT_URL, DcgmSource
from .hook_socket import DEFAULT_HOOK_SOCKET
from .nvml import NvmlApi, PynvmlApi
from .source import Source
from .workloads import (
    DEFAULT_ALLOC_DIR,
    DEFAULT_POD_LOG_ROOT,
    DEFAULT_PROC_ROOT,
    AllocationDir,
    Discovery,
    ProcResolver,
    nvml_minors,
)

log = logging.getLogger("gpufleet.agent")

DEFAULT_SPOOL = "/var/lib/gpufleet-agent"


def _env_int(name: str, default: int) -> int:
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except ValueError:
        raise SystemExit(f"gpufleet-agent: {name}={v!r} is not a whole number") from None


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(
        prog="gpufleet-agent",
        description="Sample every NVIDIA GPU once a second and send one summary per GPU per "
        "interval to the gpufleet server.",
    )
    p.add_argument("--server", default=env("GPUFLEET_SERVER"), help="server base URL")
    p.add_argument("--token", default=env("GPUFLEET_TOKEN"), help="this node's ingest token")
    p.add_argument(
        "--interval",
        type=int,
        default=_env_int("GPUFLEET_INTERVAL", 60),
        help="seconds per summary; must divide 3600 (default 60)",
    )
    p.add_argument(
        "--spool",
        default=env("GPUFLEET_SPOOL", DEFAULT_SPOOL),
        help=f"directory of the on-disk spool (default {DEFAULT_SPOOL})",
    )
    p.add_argument("--once", action="store_true", help="sample one whole interval, then exit")
    p.add_argument(
        "--print",
        dest="print_",
        action="store_true",
        help="with --once: print the payload as JSON instead of sending it",
    )
    p.add_argument("--fake", default=env("GPUFLEET_FAKE"), help="use a simulated fleet (SPEC)")
    p.add_argument(
        "--source",
        choices=("nvml", "dcgm"),
        default=env("GPUFLEET_SOURCE") or "nvml",
        help="read the GPUs through NVML (default) or an existing dcgm-exporter's /metrics",
    )
    p.add_argument(
        "--dcgm-url",
        default=env("GPUFLEET_DCGM_URL") or DEFAULT_URL,
        help=f"with --source dcgm: the exporter's metrics URL (default {DEFAULT_URL})",
    )
    p.add_argument(
        "--alloc-dir",
        default=env("GPUFLEET_ALLOC_DIR") or DEFAULT_ALLOC_DIR,
        help="with NVML: the directory of allocation files a scheduler hook writes (docs/slurm/; "
        f"default {DEFAULT_ALLOC_DIR})",
    )
    p.add_argument(
        "--proc-root",
        default=env("GPUFLEET_PROC_ROOT") or DEFAULT_PROC_ROOT,
        help="with NVML: where to read processes' cgroups and users (default /proc)",
    )
    p.add_argument(
        "--pod-log-root",
        default=env("GPUFLEET_POD_LOG_ROOT") or DEFAULT_POD_LOG_ROOT,
        help="with NVML: kubelet's pod log directory, whose entries name the pods "
        f"(default {DEFAULT_POD_LOG_ROOT})",
    )
    p.add_argument(
        "--hook-socket",
        default=env("GPUFLEET_HOOK_SOCKET"),
        help="Unix socket for jobs' gpufleet_hook reports (default /run/gpufleet/hook.sock; "
        "not with --once or --fake unless given; empty: off)",
    )
    p.add_argument("--hostname", default=env("GPUFLEET_HOSTNAME"), help="override the hostname")
    p.add_argument(
        "--spool-max-samples",
        type=int,
        default=_env_int("GPUFLEET_SPOOL_MAX_SAMPLES", 200_000),
        help="spool bound; the oldest samples are dropped (and reported) beyond it",
    )
    p.add_argument("--batch-size", type=int, default=1000, help="samples per POST (default 1000)")
    p.add_argument(
        "--queue",
        choices=("slurm", "k8s"),
        default=env("GPUFLEET_QUEUE") or None,
        help="queue pressure mode (docs/agent.md): push the scheduler's pending GPU jobs "
        "instead of sampling GPUs",
    )
    p.add_argument(
        "--cluster", default=env("GPUFLEET_CLUSTER"), help="with --queue: the cluster's name"
    )
    p.add_argument(
        "--squeue",
        default=env("GPUFLEET_SQUEUE") or "squeue",
        help="with --queue slurm: the squeue to run (default squeue)",
    )
    p.add_argument(
        "--slurmrestd",
        default=env("GPUFLEET_SLURMRESTD"),
        help="with --queue slurm: read slurmrestd at this URL instead of running squeue",
    )
    p.add_argument(
        "--jwt-file",
        default=env("GPUFLEET_JWT_FILE"),
        help="with --slurmrestd: file holding the token (X-SLURM-USER-TOKEN)",
    )
    p.add_argument(
        "--queue-interval",
        type=int,
        default=_env_int("GPUFLEET_QUEUE_INTERVAL", 60),
        help="with --queue: seconds between snapshots (default 60)",
    )
    p.add_argument("--log-level", default=env("GPUFLEET_LOG_LEVEL", "INFO"))
    p.add_argument("--version", action="version", version=f"gpufleet-agent {__version__}")
    return p


def _epoch(v: str | None) -> float | None:
    if not v:
        return None
    try:
        return float(v)
    except ValueError:
        from .fake import parse_time

        return float(parse_time(v, 0))


def _setup(
    args: argparse.Namespace,
) -> tuple[Source | NvmlApi, Clock, str | None, Discovery | None]:
    """The source (or NVML backend), the clock, the default hostname and the workload
    discovery for these arguments."""
    if args.source == "dcgm":
        return DcgmSource(args.dcgm_url), RealClock(), None, None
    if not args.fake:
        # who holds each GPU: its processes through /proc, and the scheduler's allocations
        # (device files mapped to GPUs by their minor numbers, as Slurm does)
        nvml = PynvmlApi()
        discovery = Discovery(
            ProcResolver(args.proc_root, pod_log_root=args.pod_log_root),
            AllocationDir(args.alloc_dir, minors=nvml_minors(nvml)),
        )
        return nvml, RealClock(), None, discovery
    from .fake import FakeFleet

    speed = float(os.environ.get("GPUFLEET_FAKE_SPEED") or 1.0)
    epoch = _epoch(os.environ.get("GPUFLEET_FAKE_EPOCH"))
    now = time.time()
    clock: Clock
    if args.once:
        clock = VirtualClock(epoch if epoch is not None else now)  # no need to wait
    elif speed != 1.0:
        clock = ScaledClock(epoch if epoch is not None else now, speed)
    else:
        clock = RealClock()
    fleet = FakeFleet(
        args.fake,
        seed=_env_int("GPUFLEET_FAKE_SEED", 0),
        epoch=epoch if epoch is not None else math.floor(clock.time() / 3600) * 3600,
    )
    hostname = args.hostname or fleet.nodes[0]
    if hostname not in fleet.nodes:
        raise SystemExit(f"gpufleet-agent: {hostname!r} is not in the fake fleet {fleet.nodes}")
    api = fleet.backend(hostname, clock.time)
    # the fake's own processes and allocations (spec option workloads=1), never this host's
    fake_discovery = api.discovery() if fleet.has_workloads(hostname) else None
    return api, clock, hostname, fake_discovery


def _hook_socket(args: argparse.Namespace) -> str | None:
    """Where to listen for job hook reports: the flag; by default the standard path, except
    for one interval (--once) or a simulated fleet (several may run on one machine)."""
    if args.hook_socket is not None:
        return str(args.hook_socket) or None
    return None if args.once or args.fake else DEFAULT_HOOK_SOCKET


def run_once(agent: Agent, clock: Clock) -> list[dict[str, Any]]:
    """Sample exactly one whole, aligned interval: wait for the next boundary ``S`` (ticking
    from ``S`` so the first second already has an energy baseline), tick to ``S + n``."""
    n = agent.interval_s
    now = clock.time()
    s = (math.floor(now) // n + 1) * n
    if s - 1 > now:
        clock.sleep(s - 1 - now)
    out: list[dict[str, Any]] = []
    for t in range(s - 1, s + n + 1):
        now = clock.time()
        if now < t:
            clock.sleep(t - now)
        out.extend(agent.tick(t))
    agent.source.shutdown()
    start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(s))
    return [x for x in out if x["start"] == start]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    if args.queue:
        # queue pressure (docs/agent.md, "Queue pressure"): a mode of its own, reads no GPU
        from .queue import queue_main

        return queue_main(args)
    if args.interval < 1 or 3600 % args.interval:
        print(
            f"gpufleet-agent: --interval {args.interval} must divide 3600 "
            "(e.g. 10, 30, 60, 300) so no interval crosses an hour",
            file=sys.stderr,
        )
        return 2
    if args.print_ and not args.once:
        print("gpufleet-agent: --print needs --once", file=sys.stderr)
        return 2
    if args.fake and args.source == "dcgm":
        print(
            "gpufleet-agent: --fake simulates NVML; with --source dcgm point --dcgm-url at an "
            "exporter",
            file=sys.stderr,
        )
        return 2
    sending = not (args.once and args.print_)
    if sending and not (args.server and args.token):
        print(
            "gpufleet-agent: --server and --token (or GPUFLEET_SERVER, GPUFLEET_TOKEN) are "
            "required unless --once --print",
            file=sys.stderr,
        )
        return 2
    try:
        source, clock, fake_host, discovery = _setup(args)
    except (RuntimeError, ValueError) as e:  # a bad URL or spec, prometheus-client missing
        print(f"gpufleet-agent: {e}", file=sys.stderr)
        return 2
    agent = Agent(
        source,
        spool_dir=args.spool if sending else None,
        server=args.server if sending else None,
        token=args.token,
        interval_s=args.interval,
        hostname=args.hostname or fake_host,
        clock=clock,
        max_batch=args.batch_size,
        spool_max_samples=args.spool_max_samples,
        workloads=discovery,
        hook_socket=_hook_socket(args),
    )
    try:
        if args.once:
            samples = run_once(agent, clock)
            if not agent.source.up and not samples:
                what = (
                    f"dcgm-exporter at {args.dcgm_url} did not answer"
                    if args.source == "dcgm"
                    else "NVML is not available on this host"
                )
                print(f"gpufleet-agent: {what}", file=sys.stderr)
                return 1
            if args.print_:
                payload = {
                    "node": agent.node_info(),
                    "gpus": agent.source.inventory(),
                    "samples": samples,
                }
                json.dump(payload, sys.stdout, indent=2)
                sys.stdout.write("\n")
                return 0
            assert agent.delivery is not None
            out = agent.delivery.drain(time.time, within_s=60.0)
            return 0 if out == "idle" else 1
        stop = threading.Event()

        def _stop(signum: int, frame: FrameType | None) -> None:
            log.info("received signal %d; flushing and stopping", signum)
            stop.set()

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        log.info(
            "gpufleet-agent %s: host %s, interval %d s, spool %s, server %s, %s%s",
            __version__,
            agent.hostname,
            args.interval,
            args.spool,
            args.server,
            f"dcgm-exporter {args.dcgm_url}" if args.source == "dcgm" else "NVML",
            f", fake fleet {args.fake!r}" if args.fake else "",
        )
        agent.run(stop)
        return 0
    finally:
        agent.close()


if __name__ == "__main__":
    raise SystemExit(main())
