"""A small threaded HTTP server that hands out a ready-made page: Prometheus' `/metrics`.

Built on the standard library's `ThreadingHTTPServer` in one daemon thread (plus one short-lived
thread per connection), so the daemon's event loop never waits on a client:

- GET and HEAD on `/metrics` (query strings ignored); `/` is a tiny index; anything else is 404,
  other methods 501 (the standard library's answer);
- HTTP/1.1 keep-alive, so a Prometheus scraping every second reuses its connection;
- a client that sends nothing, or reads nothing, is dropped after `timeout_s` (socket timeout);
- at most `max_connections` connections at once; past that, new ones are closed at once;
- gzip when the client asks for it (Prometheus does) and is not on this host (compression costs
  the daemon more CPU than rendering; over loopback it saves nothing), once per page;
- bind errors become `ListenError`, one line for the user ("address already in use").
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import re
import socket
import socketserver
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger("nvmon.export")

PageSource = Callable[[bool], "tuple[bytes, bool] | None"]  # accept_gzip → (body, gzipped) | None: not ready

INDEX = (b"<html><head><title>nvmon</title></head><body><h1>nvmon</h1>"
         b'<p><a href="/metrics">Metrics</a></p></body></html>\n')
_LISTEN = re.compile(r"(?:\[([0-9A-Fa-f:.%a-z]+)\]|([A-Za-z0-9.-]*)):(\d{1,5})")
_BIND_ERRORS = {
    errno.EADDRINUSE: "address already in use (another exporter, e.g. dcgm-exporter on 9400?)",
    errno.EACCES: "permission denied (ports below 1024 need root or CAP_NET_BIND_SERVICE)",
    errno.EADDRNOTAVAIL: "not an address of this machine",
}


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback or host.startswith("::ffff:127.")
    except ValueError:
        return False


class ListenError(Exception):
    """The endpoint could not be opened; the message is one line, meant for the user."""


def parse_listen(text: str) -> tuple[str, int]:
    """"HOST:PORT" → (host, port). HOST may be a name, an IPv4 address, `[IPv6]`, or empty (all
    IPv4 interfaces). Raises ValueError with the reason."""
    m = _LISTEN.fullmatch(text.strip())
    if not m:
        raise ValueError("must be HOST:PORT, e.g. 0.0.0.0:9400, 127.0.0.1:9400 or [::]:9400")
    port = int(m.group(3))
    if port > 65535:
        raise ValueError(f"port {port} is out of range (0-65535)")
    host = m.group(1) if m.group(1) is not None else (m.group(2) or "0.0.0.0")
    return host, port


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; every answer carries Content-Length
    server: _Server

    def version_string(self) -> str:
        return "nvmon"

    def setup(self) -> None:
        self.timeout = self.server.timeout_s  # applied to the socket by StreamRequestHandler.setup
        super().setup()

    def do_GET(self) -> None:  # noqa: N802 - the standard library's naming
        self._serve(head=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._serve(head=True)

    def _serve(self, head: bool) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            # Compression trades the daemon's CPU for network: worth it for a remote Prometheus,
            # not for one on this host (an agent, Alloy, an OTel collector on localhost).
            accept_gzip = ("gzip" in (self.headers.get("Accept-Encoding") or "").lower()
                           and not _is_loopback(self.client_address[0]))
            try:
                got = self.server.page(accept_gzip)
            except Exception:  # a rendering bug: answer 500, keep serving, say so (not 1000 times)
                self.server.render_errors += 1
                if self.server.render_errors in (1, 10, 100) or self.server.render_errors % 1000 == 0:
                    log.exception("rendering /metrics failed (%d times so far)", self.server.render_errors)
                self._send(500, b"rendering failed, see the daemon's log\n", "text/plain; charset=utf-8", head)
                return
            if got is None:
                self._send(503, b"no sample yet\n", "text/plain; charset=utf-8", head)
            else:
                self._send(200, got[0], self.server.content_type, head, gzipped=got[1])
        elif path == "/":
            self._send(200, INDEX, "text/html; charset=utf-8", head)
        else:
            self._send(404, b"not found; metrics are at /metrics\n", "text/plain; charset=utf-8", head)

    def _send(self, code: int, body: bytes, content_type: str, head: bool, gzipped: bool = False) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if gzipped:
            self.send_header("Content-Encoding", "gzip")
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the standard library's signature
        if log.isEnabledFor(logging.DEBUG):  # every request passes here: no formatting unless shown
            log.debug("http %s: %s", self.client_address[0], format % args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a stuck client never holds up the daemon's exit
    request_queue_size = 128  # a burst of scrapers waits in the backlog instead of being refused

    def __init__(self, address: tuple, family: int, page: PageSource, content_type: str, timeout_s: float,
                 max_connections: int):
        self.address_family = family
        self.page, self.content_type, self.timeout_s = page, content_type, timeout_s
        self.render_errors = 0
        self.rejected = 0
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks up the host's FQDN (a DNS query that can hang); not needed.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self.rejected += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address) -> None:
        # A client that vanished or stalled: its problem, not the daemon's; no traceback on stderr.
        import sys

        log.debug("http %s: %s", client_address[0] if client_address else "?", sys.exc_info()[1])


class MetricsServer:
    """Serve `page(accept_gzip)` at /metrics on `listen` ("HOST:PORT") from a daemon thread."""

    def __init__(self, listen: str, page: PageSource, *, content_type: str, timeout_s: float = 10.0,
                 max_connections: int = 256):
        self.listen = listen
        self.page, self.content_type = page, content_type
        self.timeout_s, self.max_connections = timeout_s, max_connections
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind and start serving. Raises ListenError (one line) when the address can't be used."""
        try:
            host, port = parse_listen(self.listen)
        except ValueError as e:
            raise ListenError(f"{self.listen}: {e}") from None
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except socket.gaierror as e:
            raise ListenError(f"{self.listen}: cannot resolve {host!r}: {e.strerror}") from None
        family, _, _, _, sockaddr = infos[0]
        try:
            self._httpd = _Server(sockaddr, family, self.page, self.content_type, self.timeout_s,
                                  self.max_connections)
        except OSError as e:
            raise ListenError(f"{self.listen}: {_BIND_ERRORS.get(e.errno, e.strerror or str(e))}") from None
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.25},
                                        name="nvmon-prometheus", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._httpd.server_address[1] if self._httpd is not None else 0

    @property
    def url(self) -> str:
        if self._httpd is None:
            return f"http://{self.listen}/metrics"
        host = self._httpd.server_address[0]
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}/metrics"

    @property
    def rejected(self) -> int:
        return self._httpd.rejected if self._httpd is not None else 0

    def stop(self) -> None:
        """Stop accepting and close the socket (within ~0.25 s); connections in flight are cut."""
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(1.0)
        self._httpd = None
