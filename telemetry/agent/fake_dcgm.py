"""A fake dcgm-exporter: fake GPUs (fake.py) as dcgm-exporter's ``/metrics``, on 127.0.0.1.

:func:`exposition` writes what dcgm-exporter would answer for a set of fake GPUs at a second, in
its format (``# HELP``/``# TYPE`` per field, one series per GPU labelled ``gpu``, ``UUID``,
``pci_bus_id``, ``device``, ``modelName``, ``Hostname``, ``DCGM_FI_DRIVER_VERSION``, and with
the Kubernetes pod mapper ``container``, ``namespace``, ``pod``), from the same per-second state
that ``FakeNvml`` answers with. So the NVML source and the dcgm source can be run over the
same GPUs and must send the same summaries. :class:`FakeExporter` serves any text over HTTP
and can hang, fail or go away, for the tests and the benchmark.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .fake import DRIVER_VERSION, FakeGpu

MIB = 1 << 20

# (field, Prometheus type, help), in the order of dcgm-exporter's default counters; the
# profiling fields are written for GPUs with GPM (the fake's stand-in for "DCGM profiling
# works on this GPU").
_BASIC = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
    ),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "Current clock event reasons (bitmask)."),
)
_PROF = (
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned."),
    (
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "gauge",
        "The ratio of number of warps resident on an SM.",
    ),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
    ),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Ratio of cycles the device memory interface is active."),
)
# The rest of dcgm-exporter's default counters (and two profiling ones): the agent reads none of
# them, but an answer carries them, and parsing them is part of what a scrape costs.
_UNREAD = (
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", "2619"),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", "41"),
    (
        "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
        "counter",
        "Total number of bytes transmitted through PCIe TX (in KB) via NVML.",
        "81237",
    ),
    (
        "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
        "counter",
        "Total number of bytes received through PCIe RX (in KB) via NVML.",
        "91733",
    ),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", "0"),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", "0"),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", "0"),
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
        "1438129",
    ),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status", "0"),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
        "0",
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for correctable errors",
        "0",
    ),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed", "0"),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus in bytes per second.",
        "31415926",
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "The rate of data received over the PCIe bus in bytes per second.",
        "27182818",
    ),
)
# fake.py's "unsupported" names → the fields an exporter then has no value for
_UNSUPPORTED = {
    "energy": "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "power": "DCGM_FI_DEV_POWER_USAGE",
    "temperature": "DCGM_FI_DEV_GPU_TEMP",
    "sm_clock": "DCGM_FI_DEV_SM_CLOCK",
    "throttle": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
}


def _values(g: FakeGpu, now: int) -> dict[str, str]:
    """The fields of one GPU read at ``now``: the second ``[now-1, now)``, the counter at now."""
    util, mem_util, used, _, power_mw, temp, clock, bits = g.second(now - 1)
    total_mib, reserved_mib, used_mib = g.memory_total // MIB, g.reserved // MIB, used // MIB
    out = {
        "DCGM_FI_DEV_SM_CLOCK": str(clock),
        "DCGM_FI_DEV_GPU_TEMP": str(temp),
        "DCGM_FI_DEV_POWER_USAGE": f"{power_mw / 1000:.3f}",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": str(g.energy_mj(now)),
        "DCGM_FI_DEV_GPU_UTIL": str(util),
        "DCGM_FI_DEV_MEM_COPY_UTIL": str(mem_util),
        "DCGM_FI_DEV_XID_ERRORS": "0",
        "DCGM_FI_DEV_FB_FREE": str(total_mib - reserved_mib - used_mib),
        "DCGM_FI_DEV_FB_USED": str(used_mib),
        "DCGM_FI_DEV_FB_RESERVED": str(reserved_mib),
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": str(bits),
    }
    out.update((name, value) for name, _, _, value in _UNREAD)
    for name in (_UNSUPPORTED[u] for u in g.unsupported if u in _UNSUPPORTED):
        out.pop(name, None)
    if g.gpm:
        sm, occupancy, tensor, dram = g.prof(now - 1)
        for name, pct in zip(
            (f for f, _, _ in _PROF), (util, sm, occupancy, tensor, dram), strict=True
        ):
            if pct is not None:
                out[name] = f"{pct / 100:.6f}"
    return out


def exposition(
    gpus: Sequence[FakeGpu],
    now: int,
    *,
    hostname: str = "gpu-fra1-01",
    pods: dict[str, list[tuple[str, str, str]]] | None = None,
) -> str:
    """dcgm-exporter's answer at ``now`` for ``gpus`` (lost ones are not in it). ``pods``:
    with the Kubernetes pod mapper on, uuid → [(namespace, pod, container)] holding the GPU;
    a GPU no pod holds gets empty labels."""
    present = [g for g in gpus if g.lost_at is None or now <= g.lost_at]
    values = {g.uuid: _values(g, now) for g in present}
    lines: list[str] = []
    fields = _BASIC + _PROF + tuple((name, kind, text) for name, kind, text, _ in _UNREAD)
    for name, kind, text in fields:
        lines.append(f"# HELP {name} {text}")
        lines.append(f"# TYPE {name} {kind}")
        for g in present:
            v = values[g.uuid].get(name)
            if v is None:
                continue
            base = (
                f'gpu="{g.index}",UUID="{g.uuid}",pci_bus_id="00000000:{0x18 + g.index:02X}:00.0",'
                f'device="nvidia{g.index}",modelName="{g.model.name}",Hostname="{hostname}",'
                f'DCGM_FI_DRIVER_VERSION="{DRIVER_VERSION}"'
            )
            if pods is None:
                lines.append(f"{name}{{{base}}} {v}")
                continue
            for namespace, pod, container in pods.get(g.uuid) or [("", "", "")]:
                k8s = f'container="{container}",namespace="{namespace}",pod="{pod}"'
                lines.append(f"{name}{{{base},{k8s}}} {v}")
    return "\n".join(lines) + "\n"


class _Server(ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up (timed out, closed) is no news here


class FakeExporter:
    """An HTTP server on 127.0.0.1 answering every GET with ``body()``.

    ``mode``: ``ok``; ``hang`` (read the request and never answer it; the handler gives up
    when the mode changes, at :meth:`down`, or after 10 s); ``500``. :meth:`down` closes the
    listening socket and every open connection, as a stopped exporter does (connection
    refused); :meth:`up` listens again on the same port. ``requests`` counts the GETs seen.
    """

    def __init__(self, body: Callable[[], str]) -> None:
        self.body = body
        self.mode = "ok"
        self.requests = 0
        self._release = threading.Event()
        self._conns: set[socket.socket] = set()
        self.httpd: _Server | None = None
        self.port = 0
        self.up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def up(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as Go's net/http does

            def log_message(self, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                owner._conns.add(self.connection)

            def finish(self) -> None:
                owner._conns.discard(self.connection)
                super().finish()

            def do_GET(self) -> None:  # noqa: N802
                owner.requests += 1
                if owner.mode == "hang":
                    for _ in range(200):  # until the mode changes, down(), or 10 s
                        if owner.mode != "hang" or owner._release.wait(0.05):
                            break
                    self.close_connection = True
                    return
                status = 500 if owner.mode == "500" else 200
                data = owner.body().encode() if status == 200 else b"DCGM error\n"
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._release.clear()
        httpd = _Server(("127.0.0.1", self.port), Handler)
        self.port = httpd.server_address[1]
        self.httpd = httpd
        threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def down(self) -> None:
        self._release.set()
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None
        for conn in list(self._conns):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the client
