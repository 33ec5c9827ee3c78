"""Agent cost on an 8-GPU node: CPU time per one-second tick and resident memory.

Goal (issues 3 and 15): under 2 % of one core and under 60 MB, for the NVML source with GPM on
every GPU and for the dcgm source scraping an exporter of 8 GPUs at 1 Hz.

Measurements, each beside its raw reference in the same run:

1. In process, NVML: the full tick (collector + summariser + spool writes) over the fake NVML,
   against the raw reference: the same NVML calls on the same fake backend with nothing done
   with the answers. The ratio is the agent's own overhead over the calls it cannot avoid.
   Once without GPM, once with GPM on every GPU (the reference then also takes a GPM sample
   and reads the four metrics of the pair, per GPU per tick).
   (On a real host the NVML calls themselves cost more than the fake's; run
   ``gpufleet-agent --once --print`` there under ``/usr/bin/time -v`` to see.)
2. In process, dcgm: the full tick over a fake dcgm-exporter of 8 GPUs (profiling fields and
   pod labels, served from another thread over HTTP on 127.0.0.1), against the raw reference:
   the same GET and prometheus_client's parser walking every sample. CPU of the ticking
   thread only (``time.thread_time``), so the exporter's own work is not counted.
3. In process, NVML with workload discovery (docs/agent.md): the full tick on 8 GPUs, each
   listing ``--procs-per-gpu`` real processes of this machine (read through the real /proc:
   their start time every second, their cgroup, status and environment once), with an
   allocation file naming every GPU; against the raw reference: the same NVML calls plus the
   graphics process list, a read of each listed process's /proc/<pid>/stat (what telling a
   reused pid costs) and a stat of the allocation directory.
4. The real processes, measured from /proc (CPU = utime + stime after start-up; RSS = VmRSS and
   VmHWM), pushing to a local HTTP server: ``gpufleet-agent --fake`` (GPM on) with its clock
   sped up, and ``gpufleet-agent --source dcgm`` against the fake exporter at the real 1 Hz.

Also prints the simulator's speed (samples per second of ``simulate``) for the demo.

    python bench/agent.py [--gpus 8] [--ticks 3600] [--seconds 10] [--speed 30]
                          [--dcgm-ticks 600] [--dcgm-seconds 30] [--procs-per-gpu 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pynvml  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from telemetry.agent.agent import Agent  # noqa: E402
from telemetry.agent.clock import VirtualClock  # noqa: E402
from telemetry.agent.dcgm import DcgmSource, Scraper  # noqa: E402
from telemetry.agent.fake import FakeFleet, FakeNvml, ScriptedGpu, simulate  # noqa: E402
from telemetry.agent.fake_dcgm import FakeExporter, exposition  # noqa: E402
from telemetry.agent.gpm import METRICS  # noqa: E402
from telemetry.agent.workloads import AllocationDir, Discovery, ProcResolver  # noqa: E402

T0 = 1796029200
GOAL_TICK_S = 0.02  # 2 % of one core at one tick a second
GOAL_MB = 60.0


def spec(gpus: int, gpm: bool = False) -> str:
    return f"nodes=1,gpus={gpus},model=H100,pattern=mixed,power_throttle=1" + (
        ",gpm=1" if gpm else ""
    )


class RawGpm:
    """The GPM calls of one tick for one GPU: a sample, and the metrics of the newest pair."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.samples = [api.nvmlGpmSampleAlloc(), api.nvmlGpmSampleAlloc()]
        self.req = pynvml.c_nvmlGpmMetricsGet_t()
        self.req.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        self.req.numMetrics = len(METRICS)
        for i, (metric_id, _) in enumerate(METRICS):
            self.req.metrics[i].metricId = metric_id
        self.primed = False

    def tick(self, h: Any) -> None:
        older, cur = self.samples
        self.api.nvmlGpmSampleGet(h, cur)
        if self.primed:
            self.req.sample1, self.req.sample2 = older, cur
            self.api.nvmlGpmMetricsGet(self.req)
        self.samples.reverse()
        self.primed = True


def raw_reference(api: Any, handles: list[Any], gpm: list[RawGpm] | None = None) -> None:
    """The NVML calls one tick makes, and nothing else."""
    for i, h in enumerate(handles):
        try:
            api.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
        except pynvml.NVMLError:
            pass
        api.nvmlDeviceGetUtilizationRates(h)
        api.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        api.nvmlDeviceGetComputeRunningProcesses(h)
        api.nvmlDeviceGetPowerUsage(h)
        api.nvmlDeviceGetTotalEnergyConsumption(h)
        api.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
        api.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
        api.nvmlDeviceGetCurrentClocksEventReasons(h)
        if gpm is not None:
            gpm[i].tick(h)


def per_tick(clock: VirtualClock, ticks: int, tick: Callable[[int], Any]) -> float:
    """CPU seconds of this thread per call of ``tick(t)`` over ``ticks`` simulated seconds."""
    c0 = time.thread_time()
    for t in range(T0, T0 + ticks):
        clock.set(t + 0.001)
        tick(t)
    return (time.thread_time() - c0) / ticks


def agent_per_tick(
    source: Any, clock: VirtualClock, ticks: int, workloads: Discovery | None = None
) -> float:
    """The whole agent tick (source, summariser, spool writes) after a minute's warm-up."""
    with tempfile.TemporaryDirectory() as d:
        agent = Agent(source, spool_dir=d, clock=clock, workloads=workloads)
        for t in range(T0 - 60, T0):
            clock.set(t + 0.001)
            agent.tick(t)
        cost = per_tick(clock, ticks, agent.tick)
        agent.close()
    return cost


def in_process(gpus: int, ticks: int, gpm: bool = False) -> tuple[float, float]:
    fleet = FakeFleet(spec(gpus, gpm), seed=1, epoch=T0)
    host = fleet.nodes[0]
    clock = VirtualClock(T0)
    tick_s = agent_per_tick(fleet.backend(host, clock.time), clock, ticks)
    clock = VirtualClock(T0)
    api = fleet.backend(host, clock.time)
    api.nvmlInit()
    handles = [api.nvmlDeviceGetHandleByIndex(i) for i in range(gpus)]
    raw_gpm = [RawGpm(api) for _ in handles] if gpm else None
    raw_s = per_tick(clock, ticks, lambda t: raw_reference(api, handles, raw_gpm))
    return tick_s, raw_s


def discovery_node(gpus: int, per_gpu: int) -> tuple[list[ScriptedGpu], list[list[int]]]:
    """The fake fleet's GPUs, each listing ``per_gpu`` real processes of this machine (the
    first pids of the real /proc that are still there)."""
    node = FakeFleet(spec(gpus), seed=1, epoch=T0)
    pattern = node.node(node.nodes[0]).gpus
    pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())[: gpus * per_gpu]
    if len(pids) < gpus * per_gpu:
        raise SystemExit(f"this machine runs fewer than {gpus * per_gpu} processes")
    by_gpu = [pids[i * per_gpu : (i + 1) * per_gpu] for i in range(gpus)]

    def listing(p: list[int]) -> Callable[[int], list[int]]:
        return lambda t: p

    scripted = [
        ScriptedGpu(g.uuid, g.index, g.model, g.second, pids=listing(p))
        for g, p in zip(pattern, by_gpu, strict=True)
    ]
    return scripted, by_gpu


def in_process_discovery(gpus: int, ticks: int, per_gpu: int) -> tuple[float, float]:
    """CPU per tick of the agent with workload discovery, and of the raw reference."""
    scripted, by_gpu = discovery_node(gpus, per_gpu)
    with tempfile.TemporaryDirectory() as alloc:
        job = {"kind": "slurm", "id": "48213", "user": "alice", "gpus": list(range(gpus))}
        Path(alloc, "slurm-48213.json").write_text(json.dumps(job))
        # the hooks wrote it a while ago: the directory's mtime is not recent (steady state)
        old = time.time() - 60
        os.utime(alloc, (old, old))
        clock = VirtualClock(T0)
        discovery = Discovery(ProcResolver("/proc"), AllocationDir(alloc))
        tick_s = agent_per_tick(FakeNvml(scripted, clock.time), clock, ticks, discovery)

        clock = VirtualClock(T0)
        api = FakeNvml(scripted, clock.time)
        api.nvmlInit()
        handles = [api.nvmlDeviceGetHandleByIndex(i) for i in range(gpus)]

        def raw(t: int) -> None:
            raw_reference(api, handles)
            for h, pids in zip(handles, by_gpu, strict=True):
                api.nvmlDeviceGetGraphicsRunningProcesses(h)
                for pid in pids:
                    with open(f"/proc/{pid}/stat", "rb") as f:
                        f.read(4096)
            os.stat(alloc)

        raw_s = per_tick(clock, ticks, raw)
    return tick_s, raw_s


def fake_exporter(gpus: int, clock: Any) -> FakeExporter:
    """An exporter of ``gpus`` H100 with profiling fields, each GPU held by a pod."""
    fleet = FakeFleet(spec(gpus, gpm=True), seed=1, epoch=T0)
    node = fleet.node(fleet.nodes[0]).gpus
    pods = {g.uuid: [("research", f"train-{g.index}", "trainer")] for g in node}
    return FakeExporter(lambda: exposition(node, int(clock()), pods=pods))


def dcgm_in_process(gpus: int, ticks: int) -> tuple[float, float, int]:
    """CPU of the ticking thread per tick (the exporter answers from other threads): the agent
    on the dcgm source, and the raw scrape (GET + parse); and the size of one answer in bytes."""
    clock = VirtualClock(T0)
    exporter = fake_exporter(gpus, clock.time)
    scraper = Scraper(exporter.url, 5.0)

    def raw(t: int) -> None:
        for family in text_string_to_metric_families(scraper.get()):
            for sample in family.samples:
                sample.labels.get("UUID")

    try:
        tick_s = agent_per_tick(DcgmSource(exporter.url), clock, ticks)
        size = len(scraper.get().encode())
        raw_s = per_tick(clock, ticks, raw)
    finally:
        scraper.close()
        exporter.down()
    return tick_s, raw_s, size


class _Ok(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        body = b'{"accepted": 0, "duplicates": 0, "rejected": []}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _proc(pid: int) -> tuple[float, float, float]:
    """(CPU seconds, VmRSS MB, VmHWM MB) of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    hz = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / hz  # utime + stime
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    kb = {ln.split(":")[0]: int(ln.split()[1]) for ln in status if ln.startswith("Vm")}
    return cpu, kb["VmRSS"] / 1024, kb["VmHWM"] / 1024


def as_process(
    seconds: float, speed: float, env_extra: dict[str, str], warmup_s: float = 2.0
) -> tuple[float, float, float]:
    """(CPU seconds per tick, RSS MB, peak RSS MB) of a ``gpufleet-agent`` process run with
    ``env_extra``, its clock ``speed`` times real time, delivering to a local server."""
    import subprocess

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ)
        env.update(
            {
                "GPUFLEET_SERVER": f"http://127.0.0.1:{httpd.server_address[1]}",
                "GPUFLEET_TOKEN": "bench",
                "GPUFLEET_SPOOL": d,
                "GPUFLEET_LOG_LEVEL": "WARNING",
                "GPUFLEET_FAKE_SPEED": str(speed),  # read with --fake only
                **env_extra,
            }
        )
        p = subprocess.Popen([sys.executable, "-m", "telemetry.agent.cli"], cwd=ROOT, env=env)
        try:
            time.sleep(warmup_s)  # start-up (imports, discovery) is not per-tick cost
            cpu0, _, _ = _proc(p.pid)
            t0 = time.monotonic()
            time.sleep(seconds)
            cpu1, rss, hwm = _proc(p.pid)
            wall = time.monotonic() - t0
        finally:
            p.terminate()
            p.wait(timeout=30)
    httpd.shutdown()
    ticks = wall * speed
    return (cpu1 - cpu0) / ticks, rss, hwm


def report_process(title: str, per_tick: float, rss: float, hwm: float) -> None:
    ok = per_tick < GOAL_TICK_S and hwm < GOAL_MB
    print(title)
    print(f"  CPU per tick        {per_tick * 1e3:8.3f} ms = {per_tick * 100:.3f} % of one core")
    print(f"  resident memory     {rss:8.1f} MB now, {hwm:.1f} MB peak")
    print(f"  goal (< 2 % of a core, < 60 MB): {'met' if ok else 'NOT met'}")


def report_in_process(title: str, tick_s: float, raw_s: float, raw_what: str) -> None:
    print(title)
    print(f"  agent tick          {tick_s * 1e3:8.3f} ms CPU = {tick_s * 100:.3f} % of one core")
    print(f"  {raw_what:<19} {raw_s * 1e3:8.3f} ms CPU (reference)")
    print(f"  ratio agent / raw   {tick_s / raw_s:8.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--ticks", type=int, default=3600)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--speed", type=float, default=30.0)
    ap.add_argument("--dcgm-ticks", type=int, default=600)
    ap.add_argument("--dcgm-seconds", type=float, default=30.0)
    ap.add_argument("--procs-per-gpu", type=int, default=2)
    args = ap.parse_args()
    n = args.gpus

    for gpm in (False, True):
        tick_s, raw_s = in_process(n, args.ticks, gpm)
        with_gpm = "GPM on every GPU" if gpm else "no GPM"
        what = "raw NVML+GPM calls" if gpm else "raw NVML calls"
        report_in_process(
            f"in process, NVML, {n} GPUs, {with_gpm}, {args.ticks} ticks:", tick_s, raw_s, what
        )

    tick_s, raw_s = in_process_discovery(n, args.ticks, args.procs_per_gpu)
    report_in_process(
        f"in process, NVML with workload discovery, {n} GPUs × {args.procs_per_gpu} real "
        f"processes (/proc), an allocation file, {args.ticks} ticks:",
        tick_s,
        raw_s,
        "raw NVML + /proc",
    )
    print(f"  goal (< 2 % of a core): {'met' if tick_s < GOAL_TICK_S else 'NOT met'}")

    tick_s, raw_s, size = dcgm_in_process(n, args.dcgm_ticks)
    report_in_process(
        f"in process, dcgm source, {n} GPUs ({size / 1024:.0f} KiB an answer), "
        f"{args.dcgm_ticks} ticks, ticking thread only:",
        tick_s,
        raw_s,
        "raw GET + parse",
    )

    report_process(
        f"gpufleet-agent process, NVML with GPM, {n} GPUs, clock ×{args.speed:g}, "
        "delivering over HTTP:",
        *as_process(args.seconds, args.speed, {"GPUFLEET_FAKE": spec(n, gpm=True)}),
    )
    exporter = fake_exporter(n, time.time)
    try:
        report_process(
            f"gpufleet-agent process, --source dcgm, {n} GPUs at 1 Hz for "
            f"{args.dcgm_seconds:g} s, delivering over HTTP:",
            *as_process(
                args.dcgm_seconds,
                1.0,
                {"GPUFLEET_SOURCE": "dcgm", "GPUFLEET_DCGM_URL": exporter.url},
                warmup_s=3.0,
            ),
        )
    finally:
        exporter.down()

    start = datetime(2026, 11, 1, tzinfo=UTC)
    for preset, what in (("demo", "64 GPUs"), ("workloads", "48 GPUs, with workloads")):
        c0, w0 = time.process_time(), time.perf_counter()
        count = sum(
            len(p["samples"])
            for _, p in simulate(preset, start=start, end=start + timedelta(days=1), seed=1)
        )
        dt, wall = time.process_time() - c0, time.perf_counter() - w0
        print(
            f"simulate({preset!r}), {what} × 1 day at 60 s: {count} samples, "
            f"{dt:.2f} s CPU ({wall:.2f} s wall)"
        )
        print(f"  {count / dt:,.0f} samples per CPU second; 30 days ≈ {dt * 30:.0f} s CPU")


if __name__ == "__main__":
    main()
