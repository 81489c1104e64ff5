"""Reading a TOML config file with one-line errors (`nvmon daemon`, `nvmon fleet`, `nvmon hooks`)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError


class TomlFileError(ValueError):
    """The file cannot be read as TOML; the message is one line naming the file."""


def read_toml(path: Path | str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise TomlFileError(f"{path}: no such file") from None
    except PermissionError:
        raise TomlFileError(f"{path}: permission denied") from None
    except IsADirectoryError:
        raise TomlFileError(f"{path}: is a directory") from None
    except tomllib.TOMLDecodeError as e:
        raise TomlFileError(f"{path}: not valid TOML: {e}") from None
    except UnicodeDecodeError:
        raise TomlFileError(f"{path}: not valid UTF-8") from None
    except OSError as e:
        raise TomlFileError(f"{path}: {e.strerror or e}") from None


def validation_line(source: str, e: ValidationError) -> str:
    """pydantic's first error as one line: `FILE: section.key: message (and N more)`."""
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    more = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
    return f"{source}: {loc}: {msg}{more}"
