"""Host basics through psutil: enough context to tell a sick node from a sick GPU."""

from __future__ import annotations

import os
import platform
import socket
import time

import psutil

from nvmon.model import HostSample


class HostCollector:
    def __init__(self) -> None:
        psutil.cpu_percent(interval=None)  # prime: the next call measures since now
        self._boot = psutil.boot_time()
        self._kernel = platform.release()

    def collect(self) -> HostSample:
        try:
            load1 = os.getloadavg()[0]
        except OSError:
            load1 = None
        return HostSample(
            hostname=socket.gethostname(),
            kernel=self._kernel,
            cpu_pct=psutil.cpu_percent(interval=None),
            mem_used_pct=psutil.virtual_memory().percent,
            load1=load1,
            uptime_s=max(0.0, time.time() - self._boot),
        )
