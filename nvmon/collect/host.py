"""Host basics through psutil: enough context to tell a sick node from a sick GPU."""

from __future__ import annotations

import os
import platform
import socket
import time

import psutil

from nvmon.model import HostSample


MEMORY_EVERY = 5  # ticks between /proc/meminfo reads (~0.2 ms each; memory use moves slowly)


class HostCollector:
    def __init__(self) -> None:
        psutil.cpu_percent(interval=None)  # prime: the next call measures since now
        self._boot = psutil.boot_time()
        self._kernel = platform.release()
        self._hostname = socket.gethostname()
        self._mem: float | None = None
        self._ticks = 0

    def collect(self) -> HostSample:
        try:
            load1 = os.getloadavg()[0]
        except OSError:
            load1 = None
        if self._ticks % MEMORY_EVERY == 0:
            self._mem = psutil.virtual_memory().percent
        self._ticks += 1
        return HostSample(
            hostname=self._hostname,
            kernel=self._kernel,
            cpu_pct=psutil.cpu_percent(interval=None),
            mem_used_pct=self._mem,
            load1=load1,
            uptime_s=max(0.0, time.time() - self._boot),
        )
