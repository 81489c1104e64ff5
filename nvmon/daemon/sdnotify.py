"""A tiny sd_notify(3) client: readiness, status and watchdog pings to systemd, no dependencies.

systemd passes `$NOTIFY_SOCKET` (a path, or an abstract socket written with a leading '@') to a
`Type=notify` service; each notification is one datagram of newline-separated `KEY=VALUE` lines.
Outside systemd (a terminal, the tests, `nvmon demo`) there is no socket and every call is a no-op
that returns False.

Nothing here raises into the caller: telling systemd how we are is never worth crashing the daemon.
Failures are logged at debug level and reported as False. A send waits at most `SEND_TIMEOUT_S`
(systemd's queue is practically never full), so the daemon may call these from its event loop.

Typical use in the daemon:

    sdnotify.ready()                          # after NVML/store/MQTT are up
    if (wd := sdnotify.watchdog_interval_s()) is not None:
        ... every wd / 2 seconds, from the loop that proves progress: sdnotify.watchdog()
    sdnotify.stopping()                       # first thing on SIGTERM
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)

SEND_TIMEOUT_S = 0.5


def _address(raw: str) -> str | None:
    """The socket address for `$NOTIFY_SOCKET`: '@name' is the abstract socket '\\0name'."""
    if raw.startswith("@") and len(raw) > 1:
        return "\0" + raw[1:]
    if raw.startswith("/"):
        return raw
    # e.g. systemd 254's "vsock:CID:PORT" (VMs): not needed on a bare-metal GPU node.
    log.debug("sd_notify: unsupported NOTIFY_SOCKET %r", raw)
    return None


def notify(state: str) -> bool:
    """Send `state` (one or more `KEY=VALUE` lines) to systemd. True if the datagram was sent whole."""
    raw = os.environ.get("NOTIFY_SOCKET")
    if not raw:
        return False
    addr = _address(raw)
    if addr is None:
        return False
    try:
        data = state.encode("utf-8")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(SEND_TIMEOUT_S)
            sent = sock.sendto(data, addr)
    except (OSError, UnicodeError, ValueError) as exc:  # ValueError: a NUL inside a path address
        log.debug("sd_notify %r to %r failed: %s", state, raw, exc)
        return False
    if sent != len(data):
        log.debug("sd_notify %r to %r: sent %d of %d bytes", state, raw, sent, len(data))
        return False
    return True


def ready() -> bool:
    """Startup is complete: `Type=notify` units become active only now."""
    return notify("READY=1")


def stopping() -> bool:
    """Shutdown has begun (systemd shows "deactivating" instead of suspecting a hang)."""
    return notify("STOPPING=1")


def status(text: str) -> bool:
    """A one-line status for `systemctl status`. Newlines would start new KEY=VALUE lines: flattened."""
    return notify("STATUS=" + " ".join(text.splitlines()))


def watchdog() -> bool:
    """Tell systemd we are alive. Without a ping every `WatchdogSec=`, systemd kills and restarts us."""
    return notify("WATCHDOG=1")


def watchdog_interval_s() -> float | None:
    """Seconds systemd allows between watchdog pings, or None if the watchdog is not armed for us.

    From `$WATCHDOG_USEC`; if `$WATCHDOG_PID` is set it must be our pid (a child process such as an
    alert hook inherits the variables but is not the one being watched). Ping at half this interval.
    """
    usec = os.environ.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = os.environ.get("WATCHDOG_PID")
    try:
        if pid and int(pid) != os.getpid():
            return None
        value = int(usec)
    except ValueError:
        log.debug("sd_notify: bad WATCHDOG_USEC=%r / WATCHDOG_PID=%r", usec, pid)
        return None
    if value <= 0:
        return None
    return value / 1_000_000
