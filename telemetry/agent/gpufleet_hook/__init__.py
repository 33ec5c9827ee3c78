"""``gpufleet_hook``: what a training loop tells the local gpufleet agent (docs/agent.md, "Job
efficiency hook"; DESIGN.md §9.4).

    from gpufleet_hook import Hook
    hook = Hook(model="llama-8b")
    with hook.data_wait():  batch = next(it)
    with hook.compute():    loss = train_step(batch)
    with hook.checkpoint(nbytes=n): save(state)
    hook.step(samples=32, tokens=65536, flops=3.1e15)
    hook.flush()                            # also sent every 10 s and at exit

Pure Python, no dependencies (``gpufleet_hook.pytorch`` counts a model's flops where torch is
importable). The hook keeps sums since its last report and sends them as one JSON datagram of
at most 4 KB to the agent's Unix socket (``GPUFLEET_HOOK_SOCKET``, else
``/run/gpufleet/hook.sock``) from :meth:`Hook.step` once 10 s have passed, from
:meth:`Hook.flush` and at exit. It never blocks and never raises into the job: an absent
socket, a full one (the agent is slow or stopped) or any other error drops that report, which
is counted in :attr:`Hook.dropped`; the next report starts from zero again, so nothing is
counted twice. The body names no process: the agent takes the sender's pid from the socket's
credentials.

Cost (bench/hook.py): :meth:`Hook.step` adds a few numbers and reads the monotonic clock (no
system call); the one system call of a reporting window is the ``sendto`` of its report.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import time
import weakref
from collections.abc import Callable
from types import TracebackType

__all__ = ["DEFAULT_SOCKET", "MAX_DATAGRAM", "REPORT_EVERY_S", "Hook"]

DEFAULT_SOCKET = "/run/gpufleet/hook.sock"
# The agent reads at most this many bytes per datagram and drops longer ones.
MAX_DATAGRAM = 4096
REPORT_EVERY_S = 10.0
MODEL_MAX = 200


class _Timer:
    """A reusable context manager that adds its elapsed time to one of the hook's sums (one
    object per kind, so entering it allocates nothing)."""

    __slots__ = ("_hook", "_slot", "_t0")

    def __init__(self, hook: Hook, slot: int) -> None:
        self._hook = hook
        self._slot = slot
        self._t0 = 0.0

    def __enter__(self) -> _Timer:
        self._t0 = self._hook._clock()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        h = self._hook
        h._times[self._slot] += h._clock() - self._t0


_DATA_WAIT, _COMPUTE, _CKPT = 0, 1, 2


class Hook:
    """Step-window sums of one training process, sent to the local agent.

    ``model``: the model's name as the fleet's pages show it (at most 200 characters);
    ``socket_path``: the agent's socket (default ``GPUFLEET_HOOK_SOCKET``, else
    ``/run/gpufleet/hook.sock``); ``every_s``: seconds between reports; ``clock`` (monotonic
    seconds) and ``send`` (bytes → None, raising ``OSError`` when the report cannot go) are for
    tests. ``flops_per_step``: flops added by a :meth:`step` that gives none (for instance from
    :func:`gpufleet_hook.pytorch.count_flops`); ``None`` with no flops given: the report has no
    ``flops`` and the fleet shows no MFU for it.

    Not thread-safe: one hook per training process, used from its loop's thread.
    """

    __slots__ = (
        "__weakref__",
        "_ckpt",
        "_ckpt_bytes",
        "_clock",
        "_compute",
        "_data_wait",
        "_due",
        "_every_s",
        "_flops",
        "_has_flops",
        "_path",
        "_samples",
        "_send",
        "_sock",
        "_start",
        "_steps",
        "_times",
        "_tokens",
        "dropped",
        "flops_per_step",
        "model",
        "sent",
    )

    def __init__(
        self,
        model: str = "",
        *,
        socket_path: str | None = None,
        every_s: float = REPORT_EVERY_S,
        flops_per_step: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        send: Callable[[bytes], object] | None = None,
    ) -> None:
        self.model = str(model)[:MODEL_MAX]
        self._path = socket_path or os.environ.get("GPUFLEET_HOOK_SOCKET") or DEFAULT_SOCKET
        self._every_s = float(every_s)
        self.flops_per_step = flops_per_step
        self._clock = clock
        self._send = send
        self._sock: socket.socket | None = None
        self.sent = 0  # reports handed to the socket
        self.dropped = 0  # reports lost: no agent, a full socket, any error
        self._data_wait = _Timer(self, _DATA_WAIT)
        self._compute = _Timer(self, _COMPUTE)
        self._ckpt = _Timer(self, _CKPT)
        self._reset(clock())
        # At exit the last window goes too; a weak reference, so the hook can still be freed.
        ref = weakref.ref(self)
        atexit.register(_flush_at_exit, ref)

    def _reset(self, now: float) -> None:
        self._start = now
        self._due = now + self._every_s
        self._steps = 0
        self._samples = 0.0
        self._tokens = 0.0
        self._flops = 0.0
        self._has_flops = False
        self._ckpt_bytes = 0.0
        self._times = [0.0, 0.0, 0.0]  # data wait, compute, checkpoint

    # -- the loop's calls ---------------------------------------------------------------------
    def data_wait(self) -> _Timer:
        """``with hook.data_wait(): batch = next(it)``: time spent waiting for input."""
        return self._data_wait

    def compute(self) -> _Timer:
        """``with hook.compute(): loss = train_step(batch)``: forward, backward, optimiser."""
        return self._compute

    def checkpoint(self, nbytes: float = 0) -> _Timer:
        """``with hook.checkpoint(nbytes=n): save(state)``: time spent saving ``n`` bytes."""
        try:
            self._ckpt_bytes += max(float(nbytes), 0.0)
        except (TypeError, ValueError):
            pass
        return self._ckpt

    def step(self, samples: float = 0, tokens: float = 0, flops: float | None = None) -> None:
        """One optimiser step that consumed ``samples`` samples (``tokens`` tokens) and did
        ``flops`` floating-point operations (default :attr:`flops_per_step`). Sends the window's
        sums once :data:`REPORT_EVERY_S` has passed."""
        self._steps += 1
        self._samples += samples
        self._tokens += tokens
        if flops is None:
            flops = self.flops_per_step
        if flops is not None:
            self._flops += flops
            self._has_flops = True
        if self._clock() >= self._due:
            self.flush()

    def flush(self) -> None:
        """Send the sums since the last report now (nothing when nothing happened)."""
        try:
            now = self._clock()
            try:
                body = self.report(now)
            finally:
                # a report that cannot go is dropped, never added to the next one
                self._reset(now)
            if body is None:
                return
            self._deliver(body)
            self.sent += 1
        except Exception:
            # Never into the job: no agent (ENOENT, ECONNREFUSED), a full socket (EAGAIN), a
            # report too big, anything else.
            self.dropped += 1

    def report(self, now: float) -> bytes | None:
        """The datagram of the window up to ``now``: DESIGN §9.4's JSON object, or ``None``
        when the window holds no step, wait, compute or checkpoint."""
        t = self._times
        if not (self._steps or t[0] or t[1] or t[2]):
            return None
        d: dict[str, object] = {
            "v": 1,
            "model": self.model,
            "steps": self._steps,
            "samples": _num(self._samples),
            "tokens": _num(self._tokens),
            "wall_s": round(max(now - self._start, 0.0), 6),
            "data_wait_s": round(t[_DATA_WAIT], 6),
            "compute_s": round(t[_COMPUTE], 6),
            "ckpt_s": round(t[_CKPT], 6),
            "ckpt_bytes": _num(self._ckpt_bytes),
        }
        if self._has_flops:
            d["flops"] = _num(self._flops)
        data = json.dumps(d, separators=(",", ":"), allow_nan=False).encode()
        if len(data) > MAX_DATAGRAM:
            raise ValueError("report longer than a datagram")
        return data

    def _deliver(self, data: bytes) -> None:
        if self._send is not None:
            self._send(data)
            return
        s = self._sock
        if s is None:
            s = self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            # a full socket answers EAGAIN at once instead of waiting for the agent
            s.setblocking(False)
        s.sendto(data, self._path)

    def close(self) -> None:
        """Send what is left and close the socket."""
        self.flush()
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None


def _num(v: float) -> float | int:
    """A sum as JSON writes it: whole numbers without ``.0``; NaN or infinite → 0."""
    if v != v or v in (float("inf"), float("-inf")):
        return 0
    return int(v) if float(v).is_integer() and abs(v) < 2**53 else float(v)


def _flush_at_exit(ref: weakref.ref[Hook]) -> None:
    hook = ref()
    if hook is not None:
        hook.close()
