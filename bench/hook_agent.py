"""The agent's CPU with jobs reporting to its hook socket (issue 43): 64 reports a second.

Goal: the agent with 64 reports per second stays under 2 % of one core.

One run, side by side: the real agent (``python -m telemetry.agent.cli``) on a simulated 8-GPU
H100 node with workloads, sampling every second and spooling (its server is a closed port, so
it backs off and keeps the samples), its hook socket open. Its CPU time (utime + stime from
``/proc/PID/stat``) is read over a quiet span and over a span in which this process sends
``--rate`` reports a second, each the datagram ``gpufleet_hook`` sends (the same JSON and
size). Printed: both spans' CPU in % of one core, the difference (what the reports cost) and
the ratio. The reports come from this process, which holds no GPU of the fake node: the agent
receives, parses and resolves each by its sender's pid as it would a job's, and counts it as
unattributed instead of adding it to a sample (adding to a sum is a few additions more).

    python bench/hook_agent.py [--seconds 30] [--rate 64]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = "nodes=1,gpus=8,model=H100,pattern=training,workloads=1"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (/proc/PID/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def report(i: int) -> bytes:
    """A report as gpufleet_hook sends it (one step window of a training loop)."""
    d = {
        "v": 1,
        "model": "llama-3-8b",
        "steps": 4,
        "samples": 128,
        "tokens": 262144,
        "wall_s": 1.0 + i % 7 * 1e-3,
        "data_wait_s": 0.06,
        "compute_s": 0.93,
        "ckpt_s": 0.0,
        "ckpt_bytes": 0,
        "flops": 5.1e14,
    }
    return json.dumps(d, separators=(",", ":")).encode()


def span(
    pid: int, seconds: float, send: socket.socket | None, path: str, rate: int
) -> tuple[float, int, int]:
    """The agent's CPU over ``seconds`` in % of one core, sending ``rate`` reports a second
    to ``path`` when ``send`` is given; with the reports sent and those the socket refused
    (full: the agent did not keep up)."""
    c0, t0 = cpu_s(pid), time.monotonic()
    i = refused = 0
    while (now := time.monotonic()) < t0 + seconds:
        if send is not None:
            due = int((now - t0) * rate)
            while i < due:
                try:
                    send.sendto(report(i), path)
                except (BlockingIOError, ConnectionRefusedError):
                    refused += 1  # a full socket drops the report, as the hook does
                i += 1
        time.sleep(0.005)
    return 100.0 * (cpu_s(pid) - c0) / (time.monotonic() - t0), i, refused


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=30.0, help="length of each span")
    p.add_argument("--rate", type=int, default=64, help="reports a second")
    p.add_argument("--warmup", type=float, default=10.0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "hook.sock")
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "telemetry.agent.cli",
                "--fake",
                SPEC,
                "--interval",
                "60",
                "--spool",
                os.path.join(tmp, "spool"),
                "--server",
                "http://127.0.0.1:9",
                "--token",
                "bench",
                "--hook-socket",
                path,
                "--log-level",
                "WARNING",
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while not os.path.exists(path):
                if time.monotonic() > deadline or agent.poll() is not None:
                    raise SystemExit("the agent did not open its hook socket")
                time.sleep(0.1)
            time.sleep(args.warmup)
            send = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            send.setblocking(False)
            quiet, _, _ = span(agent.pid, args.seconds, None, path, args.rate)
            busy, sent, refused = span(agent.pid, args.seconds, send, path, args.rate)
            quiet2, _, _ = span(agent.pid, args.seconds, None, path, args.rate)
        finally:
            agent.terminate()
            agent.wait(timeout=30)
    base = (quiet + quiet2) / 2
    print(f"agent, 8 simulated H100s, sampling every second: {base:.2f} % of one core")
    print(
        f"  the same with {args.rate} hook reports/s:            {busy:.2f} % of one core "
        f"({sent} reports sent, {refused} refused by a full socket)"
    )
    print(
        f"  the reports cost {busy - base:+.2f} % of one core "
        f"(ratio {busy / base:.2f}; goal: under 2 % in all)"
    )


if __name__ == "__main__":
    main()
