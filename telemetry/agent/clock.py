"""Clocks the agent runs on: the real one, and two for the fake fleet and the tests."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...


class RealClock:
    def time(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class VirtualClock:
    """Simulated time that only moves when someone sleeps: runs an hour in no time."""

    def __init__(self, start: float) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def time(self) -> float:
        return self._now

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            with self._lock:
                self._now += seconds

    def set(self, now: float) -> None:
        self._now = float(now)


class ScaledClock:
    """Wall-clock time sped up ``speed`` times around a fixed ``anchor`` (Unix seconds).

    Two processes given the same anchor and speed agree on the time, so an agent killed and
    restarted with the fake fleet continues the same simulated timeline.
    """

    def __init__(self, anchor: float, speed: float) -> None:
        self.anchor = float(anchor)
        self.speed = float(speed)

    def time(self) -> float:
        return self.anchor + (time.time() - self.anchor) * self.speed

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds / self.speed)
