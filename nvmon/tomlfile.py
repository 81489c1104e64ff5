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


# pydantic's error types → what a TOML value should have been, in the file's own words.
_EXPECTED = {
    "tuple_type": "an array", "list_type": "an array", "set_type": "an array", "dict_type": "a table",
    "model_type": "a table", "model_attributes_type": "a table", "string_type": "a string",
    "int_type": "a whole number", "int_parsing": "a whole number", "int_from_float": "a whole number",
    "float_type": "a number", "float_parsing": "a number", "bool_type": "true or false",
    "bool_parsing": "true or false",
}
_LIMITS = {"greater_than": "greater than {gt}", "greater_than_equal": "at least {ge}",
           "less_than": "less than {lt}", "less_than_equal": "at most {le}"}


def toml_type(value: Any) -> str:
    """What a TOML reader made of a value, in TOML's words: 'a string', 'an array', ..."""
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return "a date or time" if hasattr(value, "isoformat") else type(value).__name__


def location(loc: tuple | list) -> str:
    """A pydantic error location as the user wrote it: `mqtt.broker`; an array item counted from 1,
    as the docs and a reader count them: `hooks[2].command` is the second [[hooks]] table."""
    out = ""
    for p in loc:
        if isinstance(p, int):
            out += f"[{p + 1}]"
        else:
            out += ("." if out else "") + str(p)
    return out


def error_text(err: dict) -> str:
    """One pydantic error in plain words: what was expected (and what was found), never
    'Input should be a valid tuple'."""
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "missing (required)"
    if kind in _EXPECTED:
        return f"expected {_EXPECTED[kind]}, got {toml_type(err.get('input'))}"
    if kind in _LIMITS:
        try:
            return "must be " + _LIMITS[kind].format(**{k: f"{v:g}" if isinstance(v, float) else v
                                                        for k, v in ctx.items()})
        except (KeyError, IndexError):
            pass
    if kind == "literal_error" and "expected" in ctx:
        return f"must be one of {ctx['expected'].replace(chr(39), '')}"
    return err["msg"].removeprefix("Value error, ").removeprefix("Input should be ")


def validation_line(source: str, e: ValidationError, prefix: tuple = ()) -> str:
    """pydantic's first error as one line: `FILE: section.key: message (and N more problems)`;
    `prefix`: the location of what was validated (e.g. ('hooks',) for a list of hook tables)."""
    errors = e.errors()
    err = errors[0]
    return f"{source}: {location((*prefix, *err['loc']))}: {error_text(err)}{more_problems(len(errors) - 1)}"


def more_problems(n: int) -> str:
    return f" (and {n} more problem{'s' * (n > 1)})" if n > 0 else ""
