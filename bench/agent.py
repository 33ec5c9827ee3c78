"""Agent cost on an 8-GPU node: CPU time per one-second tick and resident memory.

Goal (issue 3): under 2 % of one core and under 60 MB.

Two measurements, side by side:

1. In process: the full tick (collector + summariser + spool writes) over the fake NVML,
   against the raw reference: the same NVML calls on the same fake backend with nothing done
   with the answers. The ratio is the agent's own overhead over the calls it cannot avoid.
   (On a real host the NVML calls themselves cost more than the fake's; run
   ``gpufleet-agent --once --print`` there under ``/usr/bin/time -v`` to see.)
2. The real process: ``gpufleet-agent --fake`` with its clock sped up, pushing to a local HTTP
   server, measured from /proc (CPU = utime + stime after start-up; RSS = VmRSS and VmHWM).

Also prints the simulator's speed (samples per second of ``simulate``) for the demo.

    python bench/agent.py [--gpus 8] [--seconds 10] [--speed 30]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pynvml  # noqa: E402

from telemetry.agent.agent import Agent  # noqa: E402
from telemetry.agent.clock import VirtualClock  # noqa: E402
from telemetry.agent.fake import FakeFleet, simulate  # noqa: E402

T0 = 1796029200


def spec(gpus: int) -> str:
    return f"nodes=1,gpus={gpus},model=H100,pattern=mixed,power_throttle=1"


def raw_reference(api: Any, handles: list[Any]) -> None:
    """The NVML calls one tick makes, and nothing else."""
    for h in handles:
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


def in_process(gpus: int, ticks: int) -> tuple[float, float]:
    fleet = FakeFleet(spec(gpus), seed=1, epoch=T0)
    host = fleet.nodes[0]
    with tempfile.TemporaryDirectory() as d:
        clock = VirtualClock(T0)
        agent = Agent(fleet.backend(host, clock.time), spool_dir=d, clock=clock)
        for t in range(T0 - 60, T0):  # warm up
            clock.set(t + 0.001)
            agent.tick(t)
        c0 = time.process_time()
        for t in range(T0, T0 + ticks):
            clock.set(t + 0.001)
            agent.tick(t)
        tick_s = (time.process_time() - c0) / ticks
        agent.close()
    clock = VirtualClock(T0)
    api = fleet.backend(host, clock.time)
    api.nvmlInit()
    handles = [api.nvmlDeviceGetHandleByIndex(i) for i in range(gpus)]
    c0 = time.process_time()
    for t in range(T0, T0 + ticks):
        clock.set(t + 0.001)
        raw_reference(api, handles)
    raw_s = (time.process_time() - c0) / ticks
    return tick_s, raw_s


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


def as_process(gpus: int, seconds: float, speed: float) -> tuple[float, float, float]:
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
                "GPUFLEET_FAKE": spec(gpus),
                "GPUFLEET_FAKE_SPEED": str(speed),
                "GPUFLEET_LOG_LEVEL": "WARNING",
            }
        )
        p = subprocess.Popen([sys.executable, "-m", "telemetry.agent.cli"], cwd=ROOT, env=env)
        try:
            time.sleep(2.0)  # start-up (imports, NVML discovery) is not per-tick cost
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--ticks", type=int, default=3600)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--speed", type=float, default=30.0)
    args = ap.parse_args()

    tick_s, raw_s = in_process(args.gpus, args.ticks)
    print(f"in process, {args.gpus} GPUs, {args.ticks} ticks:")
    print(f"  agent tick          {tick_s * 1e3:8.3f} ms CPU = {tick_s * 100:.3f} % of one core")
    print(f"  raw NVML calls      {raw_s * 1e3:8.3f} ms CPU (reference)")
    print(f"  ratio agent / raw   {tick_s / raw_s:8.2f}")

    per_tick, rss, hwm = as_process(args.gpus, args.seconds, args.speed)
    ok = per_tick < 0.02 and hwm < 60
    print(f"gpufleet-agent process, {args.gpus} GPUs, clock ×{args.speed:g}, delivering over HTTP:")
    print(f"  CPU per tick        {per_tick * 1e3:8.3f} ms = {per_tick * 100:.3f} % of one core")
    print(f"  resident memory     {rss:8.1f} MB now, {hwm:.1f} MB peak")
    print(f"  goal (< 2 % of a core, < 60 MB): {'met' if ok else 'NOT met'}")

    start = datetime(2026, 11, 1, tzinfo=UTC)
    c0, w0 = time.process_time(), time.perf_counter()
    n = sum(
        len(p["samples"])
        for _, p in simulate("demo", start=start, end=start + timedelta(days=1), seed=1)
    )
    dt, wall = time.process_time() - c0, time.perf_counter() - w0
    print(
        f"simulate('demo'), 64 GPUs × 1 day at 60 s: {n} samples, "
        f"{dt:.2f} s CPU ({wall:.2f} s wall)"
    )
    print(f"  {n / dt:,.0f} samples per CPU second; 30 days ≈ {dt * 30:.0f} s CPU")


if __name__ == "__main__":
    main()
