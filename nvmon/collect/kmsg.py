"""Xids the NVIDIA driver logged to the kernel ring buffer: what `nvmon audit` adds to NVML's events.

NVML delivers an Xid only to an event set registered before it happened, so a one-shot audit
cannot learn from NVML about an Xid raised a minute before it started (NVML-FACTS §4). The driver
also logs every Xid to the kernel log, e.g.

    NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus.

and `/dev/kmsg` gives each record with its time since boot in microseconds
(Documentation/ABI/testing/dev-kmsg: ``LEVEL,SEQ,USEC,FLAGS;MESSAGE``, continuation lines begin
with a space). Limits, stated where they are reported (docs/audit.md): reading it needs root (or
`kernel.dmesg_restrict = 0`); only what is still in the ring buffer is there (a busy kernel log
overwrites old records); the window is measured on the kernel's clock against this machine's
monotonic clock (time since boot, without suspend, as printk's).

`read_logged_xids` never raises for a log it cannot read or parse: an unreadable log is a note,
a malformed record a counted skip.
"""

from __future__ import annotations

import errno
import os
import re
import time
from dataclasses import dataclass

from nvmon.xid import LoggedXid

KMSG = "/dev/kmsg"
MAX_BYTES = 8 << 20  # the ring buffer is 2^CONFIG_LOG_BUF_SHIFT bytes (typically 128 KiB-2 MiB); a bound
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})(?:\.[0-7])?\): "
                  r"(\d{1,6})\b,?\s*(.*)")
_RECORD = re.compile(r"(\d+),(\d+),(\d+),[^;]*;(.*)")


@dataclass(frozen=True, slots=True)
class KernelLogXids:
    """What the kernel log said: the Xids within the window, records skipped, and a note when the
    log could not be read (or was partly lost) — for the user, one line."""

    xids: tuple[LoggedXid, ...] = ()
    skipped: int = 0  # records that could not be parsed, or overwritten while being read
    note: str | None = None


def parse_record(line: str, uptime_s: float, window_s: float) -> LoggedXid | None | bool:
    """One `/dev/kmsg` record: a LoggedXid within the window, None (not an Xid, or too old), or
    False (malformed)."""
    m = _RECORD.fullmatch(line)
    if m is None:
        return False
    x = _XID.search(m.group(4))
    if x is None:
        return None
    age = uptime_s - int(m.group(3)) / 1e6
    if age > window_s:
        return None
    bus = f"{int(x.group(1), 16):04x}:{int(x.group(2), 16):02x}:{int(x.group(3), 16):02x}"
    text = x.group(5).strip()
    return LoggedXid(bus_id=bus, xid=int(x.group(4)), age_s=max(0.0, age), text=text[:200])


def read_logged_xids(path: str | os.PathLike = KMSG, *, window_s: float = 600.0,
                     uptime_s: float | None = None) -> KernelLogXids:
    """The NVRM Xid records of the last `window_s` seconds in the kernel log at `path`.

    `uptime_s`: the kernel clock's present (default: this machine's monotonic clock, which the
    records' timestamps share); tests and the simulator pass their own."""
    now = time.monotonic() if uptime_s is None else uptime_s
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except PermissionError:
        return KernelLogXids(note=f"kernel log {os.fspath(path)} not readable (permission denied: run as root, or "
                                  "sysctl kernel.dmesg_restrict=0): Xids logged before the audit are not checked")
    except OSError as e:
        return KernelLogXids(note=f"kernel log {os.fspath(path)} not readable ({e.strerror or e}): Xids logged "
                                  "before the audit are not checked")
    xids: list[LoggedXid] = []
    skipped, total, lost, pending = 0, 0, 0, b""
    try:
        while total < MAX_BYTES:
            try:
                chunk = os.read(fd, 65536)  # /dev/kmsg: one record per read; a file: what fits
            except BlockingIOError:
                break  # /dev/kmsg: no more records
            except OSError as e:
                if e.errno == errno.EPIPE:  # /dev/kmsg: records overwritten while reading; go on
                    lost += 1
                    continue
                if not total:
                    return KernelLogXids(note=f"kernel log {os.fspath(path)} not readable ({e.strerror or e}): "
                                              "Xids logged before the audit are not checked")
                return KernelLogXids(tuple(xids), skipped, f"kernel log {os.fspath(path)}: read failed "
                                                           f"({e.strerror or e}); Xids from it may be missing")
            if not chunk:
                break
            total += len(chunk)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                if not raw or raw[:1] == b" ":  # continuation (KEY=value) lines
                    continue
                got = parse_record(raw.decode("utf-8", "replace"), now, window_s)
                if got is False:
                    skipped += 1
                elif got is not None:
                    xids.append(got)
    finally:
        os.close(fd)
    if pending.strip() and not pending.startswith(b" "):
        got = parse_record(pending.decode("utf-8", "replace"), now, window_s)
        if got is False:
            skipped += 1
        elif got is not None:
            xids.append(got)
    note = None
    if lost:
        note = f"kernel log: {lost} records were overwritten while being read; older Xids may be missing"
    elif total >= MAX_BYTES:
        note = f"kernel log: read only its first {MAX_BYTES >> 20} MiB"
    if skipped:
        what = f"{skipped} malformed kernel log record{'s' if skipped != 1 else ''} skipped"
        note = f"{note}; {what}" if note else what
    return KernelLogXids(tuple(xids), skipped + lost, note)
