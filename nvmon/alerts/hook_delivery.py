"""One configured hook delivering one batch, once: run a program, or POST JSON over HTTP.

Retries, queues and grouping live in `hook_dispatch`; what each type sends, in `hook_kinds`. This
module holds the transports (`Hook.post`, `Hook.post_all` for several servers, `Hook.run_program`),
a hook's own TLS client where it has a CA bundle or client certificate, and knows how to describe
a failure in one line (with every secret redacted) and whether retrying can help.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import ssl
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from time import time
from typing import Any

import httpx

from nvmon import __version__
from nvmon.alerts.hook_kinds import HOOK_KINDS, HookKind
from nvmon.alerts.hooks import HookConfig, HookConfigError, read_headers_file, read_secret, redact, show_target
from nvmon.alerts.model import AlertRecord

USER_AGENT = f"nvmon/{__version__}"
MAX_RETRY_AFTER_S = 120.0


class DeliveryError(Exception):
    """A failed delivery: `str()` is one line without secrets. `retryable` is False where sending
    the same thing again cannot help (HTTP 4xx, a missing program); `retry_after` is the
    server's Retry-After, if it gave one."""

    def __init__(self, message: str, *, retryable: bool = True, retry_after: float | None = None,
                 partial: bool = False):
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after
        # Delivered to some of several servers (an HA pair of Alertmanagers), not to all: the
        # dispatcher counts it sent and does not retry (the next re-send reaches the rest, as with
        # Prometheus); `nvmon hooks test` reports it as a failure.
        self.partial = partial


def make_client(verify: ssl.SSLContext | bool = True) -> httpx.AsyncClient:
    """The HTTP client hooks share: no redirects (a redirect must not carry a token elsewhere),
    proxies from the environment (HTTPS_PROXY, NO_PROXY) as operators expect. `verify`: a hook's
    own TLS settings (`Hook.tls_context`)."""
    # httpx logs every request's full URL at INFO, and a Slack or webhook URL is a secret: keep
    # those loggers quiet unless someone configured them on purpose.
    for name in ("httpx", "httpcore"):
        lg = logging.getLogger(name)
        if lg.level == logging.NOTSET:
            lg.setLevel(logging.WARNING)
    return httpx.AsyncClient(follow_redirects=False, headers={"User-Agent": USER_AGENT}, verify=verify,
                             limits=httpx.Limits(max_connections=32, max_keepalive_connections=8))


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time()
        except (TypeError, ValueError):
            return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


class Hook:
    """A configured hook. `deliver()` sends one batch once and returns a short result ("HTTP 202",
    "exit 0"), or raises DeliveryError."""

    def __init__(self, config: HookConfig, *, environ: Mapping[str, str] | None = None):
        if config.name is None:
            raise ValueError("hook configs must be named: pass them through check_hooks()")
        self.config = config
        self.kind: HookKind = HOOK_KINDS[config.type]
        self.name: str = config.name
        self._environ = environ
        # Everything that must never be shown: the secrets read so far, URLs (their paths and
        # query strings often are tokens) and header values. Redaction uses them all, also after a
        # secret file changed. (Alertmanager base URLs in `urls` carry no token in their path:
        # errors name them by scheme://host only; a query string is hidden all the same.)
        self._hidden: list[str] = [u for u in (config.url,) if u]
        for u in config.urls:
            if "?" in u:
                self._hidden.append(u.replace(u.split("?", 1)[0], "https://x", 1))  # hides its query only
        for value in config.headers.values():
            self._hide(value)
        self._own_client: httpx.AsyncClient | None = None  # with this hook's TLS settings, made on first use

    @property
    def target(self) -> str:
        """Where it delivers, safe to show: the program, or `scheme://host/…` (`+N` more servers)."""
        if self.kind.runs_program:
            return self.config.command[0] if self.config.command else "?"
        more = f" +{len(self.config.urls) - 1}" if len(self.config.urls) > 1 else ""
        return show_target(self.config.target_url) + more

    def tls_context(self) -> ssl.SSLContext:
        """The hook's TLS settings: its CA bundle (else the system's) and client certificate.
        DeliveryError (one line, no retry) if a file cannot be used."""
        cfg = self.config
        for key in ("ca_file", "cert_file", "key_file"):
            path = getattr(cfg, key)
            if path is not None and not os.path.isfile(path):
                raise DeliveryError(f"hook {self.name}: {key} {path}: no such file", retryable=False)
        try:
            ctx = ssl.create_default_context(cafile=str(cfg.ca_file) if cfg.ca_file else None)
            if cfg.cert_file is not None:
                ctx.load_cert_chain(str(cfg.cert_file), str(cfg.key_file) if cfg.key_file else None)
        except (OSError, ssl.SSLError) as e:  # unreadable, not PEM, key and certificate do not match
            raise DeliveryError(f"hook {self.name}: ca_file/cert_file/key_file: {e.strerror or e}",
                                retryable=False) from None
        return ctx

    def client(self, shared: httpx.AsyncClient) -> httpx.AsyncClient:
        """The client to post with: the shared one, or this hook's own where it has TLS settings."""
        if not self.config.tls:
            return shared
        if self._own_client is None:
            self._own_client = make_client(self.tls_context())
        return self._own_client

    async def aclose(self) -> None:
        if self._own_client is not None:
            client, self._own_client = self._own_client, None
            await client.aclose()

    @property
    def one_alert_per_delivery(self) -> bool:
        """The type's API takes one event per request (PagerDuty): its batches are split into single alerts."""
        return self.kind.one_alert_per_delivery

    def redact(self, text: str) -> str:
        return redact(text, self._hidden)

    def _hide(self, value: str) -> None:
        """Keep `value` (a header's) out of anything shown; values under 4 characters ("1",
        "gpu") are no secret and would garble messages."""
        if len(value) >= 4 and value not in self._hidden:
            self._hidden.append(value)

    def headers_file(self) -> dict[str, str]:
        """The headers of `headers_file`, re-read each time (rotation needs no restart); their
        values are remembered for redaction. Raises HookConfigError (one line, no value)."""
        headers = read_headers_file(self.config)
        for value in headers.values():
            self._hide(value)
        return headers

    def secret(self) -> str | None:
        """The current secret (re-read every time, so rotation needs no restart). Raises
        HookConfigError; remembers the value for redaction."""
        value = read_secret(self.config, self._environ)
        if value is not None and value not in self._hidden:
            self._hidden.append(value)
        return value

    async def deliver(self, client: httpx.AsyncClient, status: str, labels: dict[str, str],
                      records: list[AlertRecord], grouped: bool) -> str:
        try:
            secret = self.secret()
        except HookConfigError as e:
            raise DeliveryError(str(e)) from None
        return await self.kind.send(self, client, status, labels, records, grouped, secret)

    async def post_all(self, client: httpx.AsyncClient, urls: list[str], body: Any,
                       extra_headers: dict[str, str] | None = None) -> str:
        """POST `body` to every URL at once. Delivered where at least one accepted it (each of an
        HA pair gets every alert; the pair deduplicates); DeliveryError(partial=True) names the
        others, DeliveryError the first failure when none did."""
        if len(urls) == 1:
            return await self.post(client, urls[0], body, extra_headers)
        results = await asyncio.gather(*(self.post(client, u, body, extra_headers) for u in urls),
                                       return_exceptions=True)
        failed = [(u, r) for u, r in zip(urls, results, strict=True) if isinstance(r, BaseException)]
        for _, r in failed:
            if not isinstance(r, DeliveryError):
                raise r
        if not failed:
            return f"{results[0]} from {len(urls)} servers"
        detail = "; ".join(f"{show_target(u)}: {r}" for u, r in failed)
        if len(failed) == len(urls):
            first = failed[0][1]
            raise DeliveryError(self.redact(f"all {len(urls)} servers failed: {detail}"),
                                retryable=any(r.retryable for _, r in failed), retry_after=first.retry_after)
        raise DeliveryError(self.redact(f"{len(urls) - len(failed)} of {len(urls)} servers took it; {detail}"),
                            partial=True)

    async def post(self, client: httpx.AsyncClient, url: str | None, body: Any,
                   extra_headers: dict[str, str] | None = None) -> str:
        """POST `body` as JSON to `url` once (the hook's headers and timeout); DeliveryError if it failed."""
        assert url is not None  # guaranteed by the kind's config check
        client = self.client(client)
        t = self.config.timeout_s
        try:
            from_file = self.headers_file()
        except HookConfigError as e:
            raise DeliveryError(str(e)) from None
        headers = {"Content-Type": "application/json", **self.config.headers, **from_file, **(extra_headers or {})}
        for value in (extra_headers or {}).values():  # Authorization: Basic base64(user:secret) too
            self._hide(value)
        data = json.dumps(body, ensure_ascii=False).encode()
        try:
            # httpx's timeout is per read/write; the outer one bounds a server that drips bytes.
            async with asyncio.timeout(t):
                resp = await client.post(url, content=data, headers=headers, timeout=t)
        except TimeoutError:
            raise DeliveryError(f"timed out after {t:g} s") from None
        except httpx.TimeoutException:
            raise DeliveryError(f"timed out after {t:g} s") from None
        except httpx.HTTPError as e:
            detail = str(e) or type(e).__name__
            raise DeliveryError(self.redact(f"{type(e).__name__}: {detail}")) from None
        code = resp.status_code
        if 200 <= code < 300:
            return f"HTTP {code}"
        text = self.redact(resp.text)[:200]  # redacted before it is cut: no half secret left over
        if 300 <= code < 400:
            msg = f"HTTP {code} {resp.reason_phrase}: redirects are not followed; configure the final URL"
        else:
            msg = f"HTTP {code} {resp.reason_phrase}" + (f": {text}" if text else "")
        retryable = code >= 500 or code in (408, 425, 429)
        raise DeliveryError(self.redact(msg), retryable=retryable,
                            retry_after=_retry_after(resp.headers.get("Retry-After")) if retryable else None)

    async def run_program(self, stdin: bytes, status: str, secret: str | None) -> str:
        """Run the hook's command once with `stdin` (its secret in NVMON_HOOK_SECRET); DeliveryError if it failed."""
        argv = list(self.config.command or ())
        prog = os.path.basename(argv[0])
        env = dict(os.environ if self._environ is None else self._environ)
        env.update(NVMON_HOOK_NAME=self.name, NVMON_ALERT_STATUS=status)
        env.pop("NVMON_HOOK_SECRET", None)
        if secret:
            env["NVMON_HOOK_SECRET"] = secret
        try:
            # A list of arguments, no shell: alert text reaches the program only on stdin.
            # Its own session, so that a timeout kills whatever it started too.
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True)
        except FileNotFoundError:
            raise DeliveryError(f"{argv[0]}: no such program", retryable=False) from None
        except PermissionError:
            raise DeliveryError(f"{argv[0]}: permission denied (is it executable?)", retryable=False) from None
        except OSError as e:
            raise DeliveryError(self.redact(f"{argv[0]}: {e.strerror or e}")) from None
        try:
            async with asyncio.timeout(self.config.timeout_s):
                _, err = await proc.communicate(stdin)
        except TimeoutError:
            await _kill(proc)
            raise DeliveryError(f"{prog}: killed after the {self.config.timeout_s:g} s timeout") from None
        except BaseException:  # cancelled (daemon stopping): leave no orphan behind
            await _kill(proc)
            raise
        rc = proc.returncode
        if rc == 0:
            return "exit 0"
        lines = err.decode("utf-8", "replace").strip().splitlines()
        tail = f": {lines[-1][:200]}" if lines else ""
        how = f"killed by signal {-rc}" if rc is not None and rc < 0 else f"exited {rc}"
        raise DeliveryError(self.redact(f"{prog} {how}{tail}"))


async def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    with contextlib.suppress(Exception):
        await asyncio.shield(proc.wait())
