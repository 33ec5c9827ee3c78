"""gpufleet_hook's cost in a training loop (issue 43): ``hook.step()`` per call against a bare
loop, and the system calls of a reporting window.

Goal: ≤ 2 µs per ``step()`` call and never more than one system call per reporting window.

Measurements, side by side in one run:

1. A bare loop of N iterations doing what a loop without the hook does per step (one call of
   a small function with the same arguments), against the same loop calling
   ``hook.step(samples=32, tokens=65536, flops=3.1e15)``: per-call µs = (hook − bare) / N and
   the ratio hook / bare. The hook sends to a real Unix datagram socket that a reader drains,
   with its reporting window shortened so that windows close during the run.
2. The same loop with ``data_wait()`` and ``compute()`` around each step (the five-line loop of
   docs/agent.md), per step.
3. System calls: the windows the run closed against the hook's send counter and ``sendto``
   calls counted by wrapping the socket (one per window; ``step()`` itself reads the
   monotonic clock through the vDSO, no system call).

    python bench/hook.py [--steps 2000000]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "telemetry", "agent"))

from gpufleet_hook import Hook  # noqa: E402


def bare_step(samples: float = 0, tokens: float = 0, flops: float | None = None) -> None:
    pass


def timed(fn, n: int) -> float:
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        fn(n)
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=2_000_000)
    p.add_argument("--every-s", type=float, default=0.05, help="reporting window for the run")
    args = p.parse_args()
    n = args.steps
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "hook.sock")
        reader = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        reader.bind(path)
        reader.settimeout(0.2)
        received = [0]
        stop = threading.Event()

        def drain() -> None:
            while not stop.is_set():
                try:
                    reader.recv(8192)
                    received[0] += 1
                except TimeoutError:
                    pass

        threading.Thread(target=drain, daemon=True).start()
        sendto_calls = [0]

        class CountingHook(Hook):  # type: ignore[misc]
            """Counts the system calls that sending makes (one ``sendto`` per report)."""

            def _deliver(self, data: bytes) -> None:
                sendto_calls[0] += 1
                super()._deliver(data)

        hook = CountingHook(model="bench", socket_path=path, every_s=args.every_s)

        def bare(k: int) -> None:
            f = bare_step
            for _ in range(k):
                f(samples=32, tokens=65536, flops=3.1e15)

        def hooked(k: int) -> None:
            f = hook.step
            for _ in range(k):
                f(samples=32, tokens=65536, flops=3.1e15)

        def loop_bare(k: int) -> None:
            f = bare_step
            for _ in range(k):
                f()
                f()
                f(samples=32, tokens=65536, flops=3.1e15)

        def loop_hooked(k: int) -> None:
            h = hook
            for _ in range(k):
                with h.data_wait():
                    pass
                with h.compute():
                    pass
                h.step(samples=32, tokens=65536, flops=3.1e15)

        t_bare = timed(bare, n)
        t_hook = timed(hooked, n)
        t_loop_bare = timed(loop_bare, n // 4)
        t_loop_hook = timed(loop_hooked, n // 4)
        hook.flush()
        time.sleep(0.5)
        stop.set()
        per_call = (t_hook - t_bare) / n * 1e6
        per_loop = (t_loop_hook - t_loop_bare) / (n // 4) * 1e6
        print(f"steps per run: {n:,}; reporting window {args.every_s} s")
        print(
            f"step(): {t_hook / n * 1e6:.3f} µs a call against a bare call {t_bare / n * 1e6:.3f}"
            f" µs: +{per_call:.3f} µs, ratio {t_hook / t_bare:.2f} (goal ≤ 2 µs)"
        )
        print(
            f"data_wait + compute + step: +{per_loop:.3f} µs a step, ratio "
            f"{t_loop_hook / t_loop_bare:.2f}"
        )
        print(
            f"windows sent {hook.sent}, dropped {hook.dropped}, sendto calls {sendto_calls[0]}, "
            f"received {received[0]}: {sendto_calls[0] / max(hook.sent + hook.dropped, 1):.2f} "
            "system calls per window (goal ≤ 1)"
        )
        reader.close()


if __name__ == "__main__":
    main()
