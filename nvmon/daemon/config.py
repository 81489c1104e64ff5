"""The daemon's configuration: a TOML file (annotated example: systemd/nvmon.toml), then flags.

Validation is pydantic's, but every error reaches the user as ONE line naming the file, the key
and what is wrong: "/etc/nvmon/nvmon.toml: mqtt.broker: must be mqtt://HOST[:PORT] or mqtts://…".
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from nvmon.alerts.hooks import HookConfig, check_hooks
from nvmon.alerts.settings import AlertsSettings
from nvmon.tomlfile import TomlFileError, read_toml
from nvmon.tomlfile import validation_line as _one_line
from nvmon.wire.config import MqttSection  # shared with nvmon fleet

DEFAULT_CONFIG = Path("/etc/nvmon/nvmon.toml")
NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class ConfigError(ValueError):
    """A configuration problem, already phrased as one line for the user."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _name(v: str | None) -> str | None:
    if v is not None and not NAME_RE.match(v):
        raise ValueError("use 1-64 characters from A-Z a-z 0-9 . _ -")
    return v


class NodeSection(_Section):
    name: str | None = None
    cluster: str = "default"
    rack: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)

    _check_names = field_validator("name", "cluster", "rack")(_name)

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > 32:
            raise ValueError("at most 32 labels")
        for k, val in v.items():
            if not NAME_RE.match(k) or len(val) > 128:
                raise ValueError(f"label {k!r}: key from A-Z a-z 0-9 . _ -, value up to 128 characters")
        return v


class SamplingSection(_Section):
    interval_s: float = Field(1.0, ge=0.1, le=300)
    sysfs_root: Path = Path("/sys")
    sim: str | None = None


class StoreSection(_Section):
    path: Path = Path("/var/lib/nvmon/nvmon.db")
    raw_retention_h: float = Field(48, gt=0, le=24 * 90)
    rollup_retention_d: float = Field(90, gt=0, le=3650)


class ExpectSection(_Section):
    gpus: int | None = Field(None, ge=1, le=64)
    ib: str | None = None
    topology: str | None = Field(None, pattern="^(nvswitch|pairs|mesh|none)$")

    @field_validator("ib")
    @classmethod
    def _ib(cls, v: str | None) -> str | None:
        if v is not None:
            from nvmon.specs import parse_expect_ib

            parse_expect_ib(v)  # raises ValueError with the reason
        return v


class PrometheusSection(_Section):
    listen: str | None = None  # "HOST:PORT" serves /metrics there; None or "": no endpoint

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str | None) -> str | None:
        if v in (None, ""):
            return None
        from nvmon.export.server import parse_listen

        parse_listen(v)  # raises ValueError with the reason
        return v

    # Which dcgm-exporter page the DCGM_* families copy (nvmon.catalog.compat, docs/prometheus.md).
    dcgm_compat: str = "4.8.3"

    @field_validator("dcgm_compat", mode="before")
    @classmethod
    def _dcgm_compat(cls, v: object) -> str:
        from nvmon.catalog.compat import line

        return line(v if isinstance(v, str) else repr(v)).key  # raises ValueError with the choices


class DaemonConfig(_Section):
    node: NodeSection = Field(default_factory=NodeSection)
    sampling: SamplingSection = Field(default_factory=SamplingSection)
    store: StoreSection = Field(default_factory=StoreSection)
    mqtt: MqttSection = Field(default_factory=MqttSection)
    expect: ExpectSection = Field(default_factory=ExpectSection)
    prometheus: PrometheusSection = Field(default_factory=PrometheusSection)
    alerts: AlertsSettings = Field(default_factory=AlertsSettings)  # [alerts], see docs/alerts.md
    hooks: tuple[HookConfig, ...] = ()  # [[hooks]]: on-call hooks, see nvmon/alerts/hooks.py, docs/alerts.md

    _check_hooks = field_validator("hooks")(check_hooks)  # names unnamed hooks, refuses duplicates

    @property
    def node_name(self) -> str:
        name = self.node.name or socket.gethostname().split(".")[0]
        return re.sub(r"[^A-Za-z0-9._-]", "-", name)[:64] or "node"


# Flag name → (section, key): flags override the file.
FLAG_KEYS = {
    "broker": ("mqtt", "broker"),
    "username": ("mqtt", "username"),
    "password_file": ("mqtt", "password_file"),
    "ca_file": ("mqtt", "ca_file"),
    "cert_file": ("mqtt", "cert_file"),
    "key_file": ("mqtt", "key_file"),
    "tls_insecure": ("mqtt", "tls_insecure"),
    "db": ("store", "path"),
    "interval": ("sampling", "interval_s"),
    "node": ("node", "name"),
    "cluster": ("node", "cluster"),
    "rack": ("node", "rack"),
    "sim": ("sampling", "sim"),
    "sysfs_root": ("sampling", "sysfs_root"),
    "prometheus": ("prometheus", "listen"),
}




def load_config(path: Path | None, overrides: dict[str, Any] | None = None) -> DaemonConfig:
    """Read `path` (None: the default file if it exists, else built-in defaults), apply flag
    overrides (see FLAG_KEYS; None values are ignored), validate. Raises ConfigError (one line)."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is None and DEFAULT_CONFIG.exists():
        path = DEFAULT_CONFIG
    if path is not None:
        source = str(path)
        try:
            data = read_toml(path)
        except TomlFileError as e:
            raise ConfigError(str(e)) from None
    for flag, value in (overrides or {}).items():
        if value is None:
            continue
        section, key = FLAG_KEYS[flag]
        if not isinstance(data.get(section, {}), dict):
            break  # reported by validation below
        data.setdefault(section, {})[key] = value
        source_flag = f"--{flag.replace('_', '-')}"
        try:
            DaemonConfig.model_validate({section: {key: value}})
        except ValidationError as e:
            raise ConfigError(_one_line(source_flag, e).replace(f"{section}.{key}: ", "")) from None
    try:
        return DaemonConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_one_line(source, e)) from None
