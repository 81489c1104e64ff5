"""The `[mqtt]` table of the TOML config, shared by `nvmon daemon` and `nvmon fleet` (one set of
keys and one broker URL check; the daemon's file documents them: systemd/nvmon.toml)."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

from nvmon.wire.mqtt import parse_broker_url


class MqttSection(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    broker: str | None = "mqtt://localhost:1883"  # empty string or None: do not publish
    username: str | None = None
    password_file: Path | None = None
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    tls_insecure: StrictBool = False  # mqtts: skip the host name check only (the chain is still verified)
    keepalive_s: int = Field(10, ge=2, le=600)

    @field_validator("broker")
    @classmethod
    def _broker(cls, v: str | None) -> str | None:
        if v in (None, ""):
            return None
        if "@" in v.partition("//")[2]:  # the message never echoes the URL: it may hold a password
            raise ValueError("no credentials in the URL; use username and password_file")
        if re.search(r"\s", v):
            raise ValueError("must be mqtt://HOST[:PORT] or mqtts://HOST[:PORT]")
        try:  # the one URL check --broker uses too: IPv6 literals in brackets (mqtt://[::1]:1883)
            parse_broker_url(v)
        except ValueError:
            raise ValueError("must be mqtt://HOST[:PORT] or mqtts://HOST[:PORT] (IPv6: mqtt://[::1]:1883)") from None
        return v

    @model_validator(mode="after")
    def _tls_options(self) -> "MqttSection":
        if self.broker and self.broker.startswith("mqtt://") and self.tls_insecure:
            raise ValueError("tls_insecure needs an mqtts:// broker")
        return self
