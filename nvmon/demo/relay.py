"""A TCP pass-through between one node's daemon and the broker, so the demo can kill the node the
way a crash does: `cut()` resets both connections at once, no MQTT DISCONNECT is ever sent, and the
broker publishes the node's will (`status` offline, reason `lost`) — the path a real dead node takes.
Cutting the node's own socket would need the MQTT library's internals; a relay needs none.
"""

from __future__ import annotations

import asyncio

_CHUNK = 65536


class Relay:
    """Listens on 127.0.0.1:<free port> (`port`) and forwards each connection to `target`."""

    def __init__(self, target_host: str, target_port: int):
        self.target = (target_host, target_port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._cut = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task] = set()

    async def start(self) -> Relay:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def cut(self) -> None:
        """Reset every connection now, and refuse new ones until `restore()`."""
        self._cut = True
        for w in list(self._writers):
            w.transport.abort()

    def restore(self) -> None:
        self._cut = False

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for t in list(self._handlers):
            t.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._handlers.add(task)
        up_writer = None
        try:
            if self._cut:
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.target)
            except OSError:
                return
            self._writers.update((writer, up_writer))
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                if w is not None:
                    self._writers.discard(w)
                    if not w.transport.is_closing():  # a closing one still flushes its last bytes
                        w.transport.abort()
            self._handlers.discard(task)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy until EOF, then close the other side after what is buffered (a clean stop's DISCONNECT
        must get through); on a reset, reset the other side too."""
        try:
            while data := await reader.read(_CHUNK):
                writer.write(data)
                await writer.drain()
        except OSError:  # ConnectionResetError and friends: the pair is going away
            writer.transport.abort()
        else:
            writer.close()
