"""sd_notify against real AF_UNIX datagram sockets, standing in for systemd's notify socket."""

from __future__ import annotations

import os
import socket
import time
import uuid

import pytest

from nvmon.daemon import sdnotify


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def path_socket(tmp_path, monkeypatch):
    """A bound datagram socket at a file path, as systemd creates at /run/systemd/notify."""
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(2)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        yield sock


@pytest.fixture
def abstract_socket(monkeypatch):
    """A datagram socket in the abstract namespace, as `systemd-run`/nspawn may hand out ('@name')."""
    name = f"nvmon-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(2)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        yield sock


def received(sock: socket.socket) -> str:
    return sock.recv(4096).decode()


@pytest.mark.parametrize("call, expected", [
    (sdnotify.ready, "READY=1"),
    (sdnotify.stopping, "STOPPING=1"),
    (sdnotify.watchdog, "WATCHDOG=1"),
    (lambda: sdnotify.status("sampling 8 GPUs, broker up"), "STATUS=sampling 8 GPUs, broker up"),
    (lambda: sdnotify.notify("READY=1\nSTATUS=up"), "READY=1\nSTATUS=up"),
])
def test_messages_reach_a_path_socket(path_socket, call, expected):
    assert call() is True
    assert received(path_socket) == expected


def test_abstract_socket(abstract_socket):
    assert sdnotify.ready() is True
    assert received(abstract_socket) == "READY=1"
    assert sdnotify.watchdog() is True
    assert received(abstract_socket) == "WATCHDOG=1"


def test_status_cannot_inject_other_keys(path_socket):
    assert sdnotify.status("line one\nREADY=1\r\nline three")
    msg = received(path_socket)
    assert "\n" not in msg and "\r" not in msg
    assert msg.startswith("STATUS=line one")


def test_unicode_status(path_socket):
    assert sdnotify.status("GPU 3: NVLink 降级")
    assert received(path_socket) == "STATUS=GPU 3: NVLink 降级"


def test_no_op_outside_systemd():
    assert sdnotify.notify("READY=1") is False
    assert sdnotify.ready() is False
    assert sdnotify.watchdog() is False
    assert sdnotify.watchdog_interval_s() is None


@pytest.mark.parametrize("value", ["", "relative/path", "@", "vsock:2:1234"])
def test_unusable_socket_values_are_no_ops(monkeypatch, value):
    monkeypatch.setenv("NOTIFY_SOCKET", value)
    assert sdnotify.ready() is False


def test_missing_socket_file_is_false_not_an_exception(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone"))
    with caplog.at_level("DEBUG", logger="nvmon.daemon.sdnotify"):
        assert sdnotify.ready() is False
    assert "failed" in caplog.text


def test_socket_that_is_not_a_datagram_socket_is_false(tmp_path, monkeypatch):
    path = tmp_path / "stream"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))
        sock.listen()
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        assert sdnotify.watchdog() is False


def test_full_receiver_queue_gives_up_within_the_timeout(tmp_path, monkeypatch):
    """If systemd stopped reading, a ping must give up instead of stalling the daemon's event loop."""
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        monkeypatch.setattr(sdnotify, "SEND_TIMEOUT_S", 0.05)
        assert sdnotify.watchdog() is True
        for _ in range(100_000):  # the kernel queues a few hundred small datagrams at most
            t0 = time.monotonic()
            if not sdnotify.watchdog():
                break
        else:
            pytest.fail("the receiver's queue never filled")
        # It gave up (False) instead of blocking for good on a queue nobody reads; the bound, far
        # above its 0.05 s timeout, only catches a send that waited long, with room for a slow machine.
        assert time.monotonic() - t0 < 5.0
        assert received(sock) == "WATCHDOG=1"  # what was queued is intact


def test_watchdog_interval(monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    assert sdnotify.watchdog_interval_s() == 30.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert sdnotify.watchdog_interval_s() == 30.0


def test_watchdog_meant_for_another_process(monkeypatch):
    """An alert hook inherits WATCHDOG_USEC from the daemon but must not think it is watched."""
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert sdnotify.watchdog_interval_s() is None


@pytest.mark.parametrize("usec, pid", [("0", None), ("-5", None), ("soon", None), ("30000000", "me")])
def test_watchdog_interval_garbage(monkeypatch, usec, pid):
    monkeypatch.setenv("WATCHDOG_USEC", usec)
    if pid is not None:
        monkeypatch.setenv("WATCHDOG_PID", pid)
    assert sdnotify.watchdog_interval_s() is None
