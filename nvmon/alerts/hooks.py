"""On-call hooks: their configuration (`[[hooks]]` in the TOML config) and their secrets.

The parts of hook delivery, one module each:

- here: `HookConfig` (one `[[hooks]]` entry), `check_hooks` (names, duplicates), `load_hooks`
  (the `hooks` list of any nvmon TOML file, for `nvmon hooks test`), secrets and redaction;
- `hook_kinds`: `HOOK_KINDS`, each type declared once (its config rules, payload and delivery);
- `hook_payloads`: the JSON each type sends (pure functions of alert records);
- `hook_delivery`: `Hook`, one configured hook able to deliver a batch once (exec or HTTP);
- `hook_dispatch`: `HookDispatcher`, the engine's notifier: a worker per hook with a bounded
  queue, retries, grouping, repeat interval and statistics;
- `nvmon.cli.hooks`: `nvmon hooks test`.

Secrets (a PagerDuty routing key, a bearer token, a Slack webhook URL) come from `secret_file` or
`secret_env`, are read at each delivery (so rotation needs no restart), and never appear in logs,
errors or command output: every message leaving these modules goes through `redact()`, and hook
targets are shown as `scheme://host/…` because webhook URLs carry tokens in their path.
See docs/alerts.md, "Hooks".
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qsl, urlsplit

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from nvmon.alerts.hook_kinds import HOOK_KINDS
from nvmon.codes import Severity
from nvmon.secretfile import LooseSecretFile, check_private
from nvmon.tomlfile import TomlFileError, location, more_problems, read_toml, validation_line

HOOK_TYPES = tuple(HOOK_KINDS)
HookType = Literal[HOOK_TYPES]  # type: ignore[valid-type] - built from the registry
HOOK_STATUSES = ("firing", "resolved")
NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
HEADER_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")  # RFC 9110 token
# Alert keys a group may be split by (besides any extra label name).
GROUP_KEYS = ("cluster", "rack", "node", "gpu", "link", "device", "port", "code", "severity")


class HookConfigError(ValueError):
    """A hook configuration or secret problem, already phrased as one line (no secret in it)."""


class HookConfig(BaseModel):
    """One `[[hooks]]` entry. Which keys apply depends on `type` (its kind's `check`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: HookType
    name: str | None = None  # shown in logs, stats and `nvmon hooks test`; default: the type (+ -N)
    command: tuple[str, ...] | None = None  # exec: argv, run without a shell
    url: str | None = None  # http(s) endpoint; pagerduty defaults to the Events API v2
    urls: tuple[str, ...] = ()  # alertmanager: every Alertmanager's base URL (an HA pair gets each alert)
    timeout_s: float = Field(10.0, gt=0, le=300)
    headers: dict[str, str] = Field(default_factory=dict)
    headers_file: Path | None = None  # more headers, `Name: value` lines (secrets: an API key header); mode 0600
    secret_file: Path | None = None
    secret_env: str | None = None
    username: str | None = None  # HTTP basic auth: this user, the secret as password (else bearer)
    ca_file: Path | None = None  # TLS: verify the server against this CA bundle (else the system's)
    cert_file: Path | None = None  # TLS client certificate (PEM; with key_file unless it holds the key)
    key_file: Path | None = None
    on: tuple[Literal["firing", "resolved"], ...] = HOOK_STATUSES
    min_severity: Literal["info", "warning", "critical"] = "info"
    group_wait_s: float = Field(0.0, ge=0, le=3600)  # 0: one notification per alert, at once
    group_by: tuple[str, ...] = ("cluster", "node")
    repeat_interval_s: float = Field(0.0, ge=0, le=7 * 86400)  # 0: never re-notify a still-firing alert
    retries: int = Field(3, ge=0, le=10)
    external_url: str | None = None  # a link for people (dashboard); Alertmanager externalURL, PD client_url

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None and not NAME_RE.match(v):
            raise ValueError("use 1-64 characters from A-Z a-z 0-9 . _ -")
        return v

    @field_validator("command")
    @classmethod
    def _command(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is not None:
            if not v or not v[0]:
                raise ValueError("must be a non-empty argv list, e.g. [\"/usr/local/bin/page\", \"--team\", \"gpu\"]")
            if any("\0" in a for a in v):
                raise ValueError("arguments must not contain NUL characters")
        return v

    @field_validator("url", "external_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None:
            check_url(v)
        return v

    @field_validator("urls")
    @classmethod
    def _urls(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if len(v) > 8:
            raise ValueError("at most 8 URLs")
        for u in v:
            check_url(u)
        return tuple(dict.fromkeys(v))

    @field_validator("username")
    @classmethod
    def _username(cls, v: str | None) -> str | None:
        if v is not None and (not v or ":" in v or any(c in v for c in "\r\n\0") or len(v) > 256):
            raise ValueError("must be 1-256 characters without ':' or line breaks")
        return v

    @field_validator("headers")
    @classmethod
    def _headers(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > 32:
            raise ValueError("at most 32 headers")
        for k, val in v.items():
            if not HEADER_RE.match(k):
                raise ValueError(f"header name {k[:40]!r}: not a valid HTTP header name")
            if any(c in val for c in "\r\n\0") or len(val) > 4096:
                raise ValueError(f"header {k!r}: value must be one line of at most 4096 characters")
        return v

    @field_validator("secret_env")
    @classmethod
    def _secret_env(cls, v: str | None) -> str | None:
        if v is not None and not ENV_RE.match(v):
            raise ValueError("must be an environment variable name (A-Z a-z 0-9 _)")
        return v

    @field_validator("on")
    @classmethod
    def _on(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError('list at least one of "firing", "resolved"')
        return tuple(dict.fromkeys(v))

    @field_validator("group_by")
    @classmethod
    def _group_by(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for k in v:
            if not NAME_RE.match(k):
                raise ValueError(f"{k[:40]!r}: not a label name ({', '.join(GROUP_KEYS)} or an extra label)")
        return tuple(dict.fromkeys(v))

    @model_validator(mode="after")
    def _per_type(self) -> HookConfig:
        if self.secret_file is not None and self.secret_env is not None:
            raise ValueError(f"{self.type} hook: give secret_file or secret_env, not both")
        HOOK_KINDS[self.type].check(self)
        return self

    @property
    def target_url(self) -> str | None:
        """The configured endpoint, or the type's default (PagerDuty's Events API); the first of
        `urls` for alertmanager; None for exec, and for slack when the URL is the secret."""
        return self.url or (self.urls[0] if self.urls else None) or HOOK_KINDS[self.type].default_url

    @property
    def tls(self) -> bool:
        """Whether this hook needs its own TLS settings (a CA bundle or a client certificate)."""
        return self.ca_file is not None or self.cert_file is not None

    def wants_severity(self, severity: str) -> bool:
        return Severity.rank_of(severity) <= Severity.rank_of(self.min_severity)  # unknown words: least severe


def check_url(url: str) -> None:
    """http(s)://HOST[:PORT][/path]; ValueError with a reason that does not echo the URL
    (its path or query may be a token)."""
    try:
        u = urlsplit(url)
        u.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ValueError("not a valid URL") from None
    if u.scheme not in ("http", "https"):
        raise ValueError("must start with http:// or https://")
    if not u.hostname:
        raise ValueError("has no host")
    if u.username is not None or u.password is not None:
        raise ValueError("no credentials in the URL; put a token in secret_file or secret_env")
    if any(c.isspace() for c in url):
        raise ValueError("must not contain spaces")


def show_target(url: str | None) -> str:
    """`https://hooks.slack.com/…`: scheme and host only (paths and queries may hold tokens)."""
    if not url:
        return "(url from secret)"
    try:
        u = urlsplit(url)
        host = u.hostname or "?"
        port = f":{u.port}" if u.port else ""
    except ValueError:
        return "(url)"
    host = f"[{host}]" if ":" in host else host
    more = "/…" if (u.path not in ("", "/") or u.query) else ""
    return f"{u.scheme}://{host}{port}{more}"


def check_hooks(hooks: list[HookConfig] | tuple[HookConfig, ...]) -> tuple[HookConfig, ...]:
    """Give unnamed hooks a name (`slack`, or `webhook-1`, `webhook-2` when a type repeats) and
    refuse duplicate names. Used as a validator of the config's `hooks` list."""
    if len(hooks) > 64:
        raise ValueError("at most 64 hooks")
    per_type: dict[str, int] = {}
    for h in hooks:
        per_type[h.type] = per_type.get(h.type, 0) + 1
    seen: dict[str, int] = {}
    named: list[HookConfig] = []
    for h in hooks:
        if h.name is None:
            seen[h.type] = seen.get(h.type, 0) + 1
            name = h.type if per_type[h.type] == 1 else f"{h.type}-{seen[h.type]}"
            h = h.model_copy(update={"name": name})
        named.append(h)
    names = [h.name for h in named]
    for n in names:
        if names.count(n) > 1:
            raise ValueError(f"two hooks are named {n!r}; give each a unique name")
    return tuple(named)


_HOOK_LIST = TypeAdapter(list[HookConfig])


def _one_line(source: str, e: ValidationError) -> str:
    """The first error, the hook counted from 1 as the docs count them: `FILE: hooks[2].url: ...`."""
    err = e.errors()[0]
    if err["type"] == "literal_error" and err["loc"][-1:] == ("type",):
        loc = location(("hooks", *err["loc"]))
        return f"{source}: {loc}: must be one of {', '.join(HOOK_TYPES)}{more_problems(len(e.errors()) - 1)}"
    return validation_line(source, e, ("hooks",))


def parse_hooks(data: Any, source: str = "config") -> tuple[HookConfig, ...]:
    """Validate a `hooks` value (a list of tables). Raises HookConfigError (one line)."""
    try:
        return check_hooks(_HOOK_LIST.validate_python(data))
    except ValidationError as e:
        raise HookConfigError(_one_line(source, e)) from None
    except ValueError as e:
        raise HookConfigError(f"{source}: hooks: {e}") from None


def load_hooks(path: Path) -> tuple[tuple[HookConfig, ...], dict[str, Any]]:
    """The hooks of any nvmon TOML config (daemon or fleet) and its `[node]` table (loosely read,
    for the test alert's labels). Raises HookConfigError (one line)."""
    try:
        data = read_toml(path)
    except TomlFileError as e:
        raise HookConfigError(str(e)) from None
    raw = data.get("hooks", [])
    if not isinstance(raw, list):
        raise HookConfigError(f"{path}: hooks: must be a list of tables ([[hooks]])")
    hooks = parse_hooks(raw, str(path))
    node = data.get("node") if isinstance(data.get("node"), dict) else {}
    return hooks, node


def read_secret(hook: HookConfig, environ: Any = None) -> str | None:
    """The hook's secret (file content or environment value, surrounding whitespace stripped), or
    None if it has none. Raises HookConfigError naming the file or variable, never the value."""
    env = os.environ if environ is None else environ
    if hook.secret_file is not None:
        where = f"hook {hook.name}: secret_file {hook.secret_file}"
        value = _read_private(hook.secret_file, where).strip()
    elif hook.secret_env is not None:
        where = f"hook {hook.name}: secret_env {hook.secret_env}"
        value = (env.get(hook.secret_env) or "").strip()
        if not value:
            raise HookConfigError(f"{where}: not set")
    else:
        return None
    if not value:
        raise HookConfigError(f"{where}: is empty")
    if any(c in value for c in "\r\n\0"):
        raise HookConfigError(f"{where}: must be a single line")
    if HOOK_KINDS[hook.type].secret_is_url:
        try:
            check_url(value)
        except ValueError as e:
            raise HookConfigError(f"{where}: the Slack webhook URL {e}") from None
    return value


def read_headers_file(hook: HookConfig) -> dict[str, str]:
    """The headers in the hook's `headers_file` (`Name: value` lines; blank lines and `#` comments
    skipped), {} without one. Read at every delivery, like secrets; refused when others may read
    it. Raises HookConfigError naming the file and line, never a value."""
    if hook.headers_file is None:
        return {}
    where = f"hook {hook.name}: headers_file {hook.headers_file}"
    out: dict[str, str] = {}
    for n, line in enumerate(_read_private(hook.headers_file, where).splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition(":")
        name, value = name.strip(), value.strip()
        if not sep or not HEADER_RE.match(name):
            raise HookConfigError(f"{where}: line {n}: expected 'Name: value' with a valid HTTP header name")
        if not value or len(value) > 4096 or "\0" in value:
            raise HookConfigError(f"{where}: line {n}: {name}: the value must be 1-4096 characters")
        if name.lower() == "authorization" and (hook.secret_file is not None or hook.secret_env is not None):
            raise HookConfigError(f"{where}: line {n}: the secret is sent as Authorization; drop one of them")
        out[name] = value
    if len(out) > 32:
        raise HookConfigError(f"{where}: at most 32 headers")
    return out


def _read_private(path: Path, where: str) -> str:
    """A secret file's text, if only its owner (and group, for another owner) may read it."""
    try:
        check_private(path)  # as ssh: a secret others may read is refused
        with open(path, encoding="utf-8") as f:
            return f.read(65536)
    except LooseSecretFile as e:
        raise HookConfigError(f"{where}: {e.strerror}") from None
    except FileNotFoundError:
        raise HookConfigError(f"{where}: no such file") from None
    except PermissionError:
        raise HookConfigError(f"{where}: permission denied") from None
    except IsADirectoryError:
        raise HookConfigError(f"{where}: is a directory") from None
    except UnicodeDecodeError:
        raise HookConfigError(f"{where}: not UTF-8 text") from None
    except OSError as e:
        raise HookConfigError(f"{where}: {e.strerror or type(e).__name__}") from None


def redact(text: str, secrets: list[str] | tuple[str, ...]) -> str:
    """`text` with every secret (and, for URL secrets, their path and query string, raw and
    decoded) replaced by `***`, on one line."""
    for s in sorted((s for s in secrets if s), key=len, reverse=True):  # a secret inside another: the longer first
        text = text.replace(s, "***")
        if "://" in s:
            u = urlsplit(s)
            if len(u.path) > 1:
                text = text.replace(u.path, "/***")
            if u.query:
                values = [v for part in u.query.split("&") for v in (part.partition("=")[2],) if v]
                values += [v for _, v in parse_qsl(u.query)]
                for v in sorted({u.query, *values}, key=len, reverse=True):
                    if len(v) >= 3:
                        text = text.replace(v, "***")
    return " ".join(text.split())
