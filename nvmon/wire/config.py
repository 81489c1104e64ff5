"""The `[mqtt]` table of the TOML config, shared by `nvmon daemon` and `nvmon fleet` (one set of
keys and one broker URL check; the daemon's file documents them: systemd/nvmon.toml)."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator


class MqttSection(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    broker: str | None = "mqtt://localhost:1883"  # empty string or None: do not publish
    username: str | None = None
    password_file: Path | None = None
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    keepalive_s: int = Field(10, ge=2, le=600)

    @field_validator("broker")
    @classmethod
    def _broker(cls, v: str | None) -> str | None:
        if v in (None, ""):
            return None
        if "@" in v.partition("//")[2]:  # the message never echoes the URL: it may hold a password
            raise ValueError("no credentials in the URL; use username and password_file")
        if not re.match(r"^mqtts?://[^/\s:]+(:\d{1,5})?/?$", v):
            raise ValueError("must be mqtt://HOST[:PORT] or mqtts://HOST[:PORT]")
        return v
