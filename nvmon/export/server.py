"""The HTTP server that hands out a ready-made page: Prometheus' `/metrics`.

One thread runs its own asyncio event loop (never the daemon's) with h11 parsing HTTP/1.1, so a
connection costs a socket and a few KB, not a thread; pages come from a pool of two worker threads,
so a rendering never stalls the other connections. Built to stay up under abuse:

- GET and HEAD on `/metrics` (query strings ignored); `/` is a tiny index; anything else is 404,
  other methods 501;
- HTTP/1.1 keep-alive, so a Prometheus scraping every second reuses its connection;
- deadlines per request, not per receive: a connection waiting for a request is closed after
  `idle_s`; once a request's first byte arrives, its headers must be complete within `header_s`
  (a client dripping a byte at a time, "slowloris", is cut there); an answer the client does not
  read within `write_s` is abandoned;
- at most `max_header_bytes` of request headers (h11's buffer cap) in at most `max_header_lines`
  lines: past either the client gets 431 and is closed; nothing is buffered beyond that, and every
  buffer belongs to its connection and goes with it;
- at most `max_connections` open: a new connection is never refused: the one that has waited
  longest for a request (idle, or dripping its headers) is closed to make room, and only if none is
  waiting, the oldest in service;
- gzip when the client asks for it (Prometheus does) and is not on this host (compression costs
  the daemon more CPU than rendering; over loopback it saves nothing), once per page;
- bind errors become `ListenError`, one line for the user ("address already in use").

Why not a ready server: waitress closes a connection only after `channel_timeout` of silence (one
byte a minute keeps it) and stops accepting at its `connection_limit`; uvicorn and aiohttp have no
header deadline and answer 503 past their limit; all want a framework around them. The parsing is
h11's (python-hyper, also under httpx); this module adds the deadlines, the caps and the shedding.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import re
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import h11

log = logging.getLogger("nvmon.export")

PageSource = Callable[[bool], "tuple[bytes, bool] | None"]  # accept_gzip → (body, gzipped) | None: not ready

INDEX = (b"<html><head><title>nvmon</title></head><body><h1>nvmon</h1>"
         b'<p><a href="/metrics">Metrics</a></p></body></html>\n')
TEXT = b"text/plain; charset=utf-8"
_LISTEN = re.compile(r"(?:\[([0-9A-Fa-f:.%a-z]+)\]|([A-Za-z0-9.-]*)):(\d{1,5})")
_BIND_ERRORS = {
    errno.EADDRINUSE: "address already in use (another exporter, e.g. dcgm-exporter on 9400?)",
    errno.EACCES: "permission denied (ports below 1024 need root or CAP_NET_BIND_SERVICE)",
    errno.EADDRNOTAVAIL: "not an address of this machine",
}
_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 431: b"Request Header Fields Too Large",
            500: b"Internal Server Error", 501: b"Not Implemented", 503: b"Service Unavailable"}
REPORT_EVERY_S = 60.0  # abuse (shed connections, cut requests) is logged at most this often


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


class _Conn(asyncio.Protocol):
    """One client connection: waiting (for a request, or for the rest of its headers) or busy."""

    def __init__(self, server: MetricsServer):
        self.srv = server
        self.h = h11.Connection(h11.SERVER, max_incomplete_event_size=server.max_header_bytes)
        self.t: asyncio.Transport | None = None
        self.peer = "?"
        self.busy = False  # a request is being answered: reading is paused until it is sent
        self.started = False  # a request's first byte has arrived: the header deadline runs
        self.sent = False  # the whole answer is handed to the transport
        self.paused = False  # the transport's buffer holds unsent bytes (pause_writing)
        self.closed = False
        self.timer: asyncio.TimerHandle | None = None

    # -- asyncio's callbacks

    def connection_made(self, transport) -> None:
        self.t = transport
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if peer else "?"
        transport.set_write_buffer_limits(high=0)  # pause_writing whenever a send did not complete
        self.srv._admit(self)
        self._wait()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        if not self.busy and not self.started:
            self.started = True
            self._arm(self.srv.header_s, "header")
        self.h.receive_data(data)
        if not self.busy:
            self._next()

    def eof_received(self) -> bool:
        self.h.receive_data(b"")  # a half-closed client still gets the answer to what it sent
        if not self.busy:
            self._next()
        return True

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.busy and self.sent:
            self._done()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self._cancel()
        self.srv._forget(self)

    # -- the request cycle

    def _wait(self) -> None:
        """Ready for the next request (a new connection, or the previous answer sent)."""
        self.busy = self.sent = False
        self.started = bool(self.h.trailing_data[0])  # a pipelined request already buffered
        self.srv._waiting.pop(self, None)
        self.srv._waiting[self] = None  # the newest waiter: shed last
        self._arm(self.srv.header_s if self.started else self.srv.idle_s, "header" if self.started else "idle")

    def _next(self) -> None:
        try:
            event = self.h.next_event()
        except h11.RemoteProtocolError as e:
            self.srv._note("bad")
            self._refuse(e.error_status_hint)
            return
        if isinstance(event, h11.Request):
            self._request(event)
        elif isinstance(event, h11.ConnectionClosed) or (event is h11.NEED_DATA and self.h.their_state is h11.DONE):
            self.close()

    def _request(self, req: h11.Request) -> None:
        srv = self.srv
        srv._waiting.pop(self, None)
        self.busy = True
        self.t.pause_reading()  # pipelined requests wait in the kernel, not in our buffers
        self._arm(srv.write_s, "write")
        # h11 caps what it buffers of an unfinished request; a whole one that came in one read is
        # measured here (what h11 parsed, about the bytes sent)
        size = len(req.target) + sum(len(k) + len(v) + 4 for k, v in req.headers)
        if len(req.headers) > srv.max_header_lines or size > srv.max_header_bytes:
            srv._note("bad")
            self._refuse(431)
            return
        try:  # a GET without a body ends here; anything with a body is answered, then closed
            complete = self.h.next_event() is h11.EndOfMessage or self.h.their_state is h11.DONE
        except h11.RemoteProtocolError:
            complete = False
        head = req.method == b"HEAD"
        path = req.target.split(b"?", 1)[0]
        if req.method not in (b"GET", b"HEAD"):
            self._respond(501, b"only GET and HEAD\n", TEXT, head, close=True)
        elif path == b"/metrics":
            # Compression trades the daemon's CPU for network: worth it for a remote Prometheus,
            # not for one on this host (an agent, Alloy, an OTel collector on localhost).
            gz = (b"gzip" in b",".join(v for k, v in req.headers if k == b"accept-encoding").lower()
                  and not _is_loopback(self.peer))
            fut = asyncio.get_running_loop().run_in_executor(srv._pool, srv._page, gz)
            fut.add_done_callback(lambda f: self._page_done(f, head, complete))
        elif path == b"/":
            self._respond(200, INDEX, b"text/html; charset=utf-8", head, close=not complete)
        else:
            self._respond(404, b"not found; metrics are at /metrics\n", TEXT, head, close=not complete)

    def _page_done(self, fut, head: bool, complete: bool) -> None:
        if self.closed:
            return
        got = fut.result()  # _page never raises
        if got == 500:
            self._respond(500, b"rendering failed, see the daemon's log\n", TEXT, head, close=not complete)
        elif got is None:
            self._respond(503, b"no sample yet\n", TEXT, head, close=not complete)
        else:
            self._respond(200, got[0], self.srv.content_type, head, gzipped=got[1], close=not complete)

    def _respond(self, code: int, body: bytes, ctype: bytes, head: bool, *, gzipped: bool = False,
                 close: bool = False) -> None:
        headers = [(b"Server", b"nvmon"), (b"Content-Type", ctype), (b"Content-Length", b"%d" % len(body))]
        if gzipped:
            headers.append((b"Content-Encoding", b"gzip"))
        if close:
            headers.append((b"Connection", b"close"))
        try:
            self.t.write(self.h.send(h11.Response(status_code=code, headers=headers, reason=_REASONS[code])))
            if body and not head:
                for chunk in self.h.send_with_data_passthrough(h11.Data(data=body)):  # no copy of the page
                    self.t.write(chunk)
            self.t.write(self.h.send(h11.EndOfMessage()))
        except h11.LocalProtocolError:
            self.close()
            return
        self.sent = True
        if not self.paused:
            self._done()

    def _refuse(self, code: int | None) -> None:
        """Answer a request we will not parse (too large, malformed) and close."""
        code = code if code in _REASONS else 400
        self.busy = self.sent = True
        self.t.write(b"HTTP/1.1 %d %s\r\nServer: nvmon\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
                     % (code, _REASONS[code]))
        self.close()

    def _done(self) -> None:
        """The answer left our buffer: next request, or close."""
        if self.h.our_state is not h11.DONE or self.h.their_state is not h11.DONE:
            self.close()  # Connection: close, HTTP/1.0, or a body we did not read
            return
        self.h.start_next_cycle()
        self._wait()
        self.t.resume_reading()
        if self.started:
            self._next()

    # -- deadlines and closing

    def _arm(self, seconds: float, why: str) -> None:
        self._cancel()
        self.timer = asyncio.get_running_loop().call_later(seconds, self._expired, why)

    def _cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expired(self, why: str) -> None:
        self.timer = None
        if why != "idle":  # an idle keep-alive connection timing out is normal; the others are not
            self.srv._note(why)
        self.close(abort=True)

    def close(self, abort: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        self._cancel()
        self.srv._forget(self)
        if abort:
            self.t.abort()  # nothing more for this client: drop what is queued
        else:
            self.t.close()  # after what is queued is sent


class MetricsServer:
    """Serve `page(accept_gzip)` at /metrics on `listen` ("HOST:PORT") from a thread of its own."""

    def __init__(self, listen: str, page: PageSource, *, content_type: str, idle_s: float = 10.0,
                 header_s: float = 3.0, write_s: float = 10.0, max_connections: int = 256,
                 max_header_bytes: int = 8192, max_header_lines: int = 64, workers: int = 2):
        self.listen = listen
        self.page, self.content_type = page, content_type.encode()
        self.idle_s, self.header_s, self.write_s = idle_s, header_s, write_s
        self.max_connections = max_connections
        self.max_header_bytes, self.max_header_lines = max_header_bytes, max_header_lines
        self.workers = workers
        # Counters, written on the server's loop only: connections closed to make room, requests cut
        # at the header or write deadline, requests refused as too large or malformed.
        self.shed = self.header_timeouts = self.write_timeouts = self.bad_requests = 0
        self.render_errors = 0
        self._conns: dict[_Conn, None] = {}  # every open connection, oldest first
        self._waiting: dict[_Conn, None] = {}  # those waiting for a request, longest-waiting first
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._reported = {"shed": 0, "header": 0, "write": 0, "bad": 0}
        self._report_at = 0.0
        self._report_due = False

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
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(sockaddr)
            sock.listen(128)  # a burst of scrapers waits in the backlog instead of being refused
        except OSError as e:
            sock.close()
            raise ListenError(f"{self.listen}: {_BIND_ERRORS.get(e.errno, e.strerror or str(e))}") from None
        sock.setblocking(False)
        self._sock = sock
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="nvmon-prometheus-page")
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), name="nvmon-prometheus", daemon=True)
        self._thread.start()
        ready.wait(5.0)

    def _serve(self, ready: threading.Event) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            server = loop.run_until_complete(loop.create_server(lambda: _Conn(self), sock=self._sock, backlog=128))
        finally:
            ready.set()
        try:
            loop.run_forever()
        finally:
            server.close()
            for conn in list(self._conns):
                conn.close(abort=True)
            loop.run_until_complete(asyncio.sleep(0))  # let the transports finish closing
            loop.close()

    @property
    def port(self) -> int:
        return self._sock.getsockname()[1] if self._sock is not None else 0

    @property
    def url(self) -> str:
        if self._sock is None:
            return f"http://{self.listen}/metrics"
        host = self._sock.getsockname()[0]
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}/metrics"

    @property
    def connections(self) -> int:
        return len(self._conns)

    def stop(self) -> None:
        """Stop accepting and close the socket (within ~0.1 s); connections in flight are cut."""
        if self._loop is None:
            return
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(1.0)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._sock.close()
        self._loop = self._thread = self._pool = self._sock = None

    # -- for the connections (on the server's loop)

    def _admit(self, conn: _Conn) -> None:
        while len(self._conns) >= self.max_connections:
            victim = next(iter(self._waiting or self._conns))
            self._note("shed")
            victim.close(abort=True)
        self._conns[conn] = None

    def _forget(self, conn: _Conn) -> None:
        self._conns.pop(conn, None)
        self._waiting.pop(conn, None)

    def _page(self, accept_gzip: bool):
        """The page, in a worker thread: (body, gzipped), None (no sample yet) or 500 (a bug)."""
        try:
            return self.page(accept_gzip)
        except Exception:  # a rendering bug: answer 500, keep serving, say so (not 1000 times)
            self.render_errors += 1
            if self.render_errors in (1, 10, 100) or self.render_errors % 1000 == 0:
                log.exception("rendering /metrics failed (%d times so far)", self.render_errors)
            return 500

    def _note(self, what: str) -> None:
        if what == "shed":
            self.shed += 1
        elif what == "header":
            self.header_timeouts += 1
        elif what == "write":
            self.write_timeouts += 1
        else:
            self.bad_requests += 1
        now = time.monotonic()
        if now >= self._report_at:
            self._report()
        elif not self._report_due:  # what happens until then is reported then
            self._report_due = True
            asyncio.get_running_loop().call_later(self._report_at - now, self._report)

    def _report(self) -> None:
        self._report_due = False
        self._report_at = time.monotonic() + REPORT_EVERY_S
        counts = {"shed": self.shed, "header": self.header_timeouts, "write": self.write_timeouts,
                  "bad": self.bad_requests}
        d = {k: v - self._reported[k] for k, v in counts.items()}
        self._reported = counts
        if any(d.values()):
            log.warning("metrics endpoint: abusive clients? %d connections closed to make room (%d open at most), "
                        "%d requests cut at the %g s header deadline, %d answers unread after %g s, %d oversized "
                        "or malformed requests (reported at most every %g s)", d["shed"], self.max_connections,
                        d["header"], self.header_s, d["write"], self.write_s, d["bad"], REPORT_EVERY_S)
