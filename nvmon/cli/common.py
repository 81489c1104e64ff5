"""What the `nvmon` commands share: the one error class, the name and interval checks, defaults,
the log format, the fleet/daemon config reader and the broker settings built from its `[mqtt]`.

Every command reports bad input the same way, in one line on stderr, never a traceback
(`main()` adds NVMON_DEBUG=1 for one):

    bad usage (a flag or argument as typed)   `nvmon <command>: <message>`, exit 2   (click's own
                                               usage errors too; NvmonUsageError)
    could not do it (files, database, broker) `nvmon: <message>`, exit 1              (NvmonError)
    `nvmon audit`                             Nagios codes: 0-2 the verdict, 3 UNKNOWN for both
"""

from __future__ import annotations

import os
import re
import ssl
from pathlib import Path

import click

from nvmon.secretfile import check_private
from nvmon.wire.contract import valid_name

DEFAULT_DB = "/var/lib/nvmon/nvmon.db"  # the daemon's history and alert state
DEFAULT_FLEET_DB = "/var/lib/nvmon/fleet.db"  # nvmon fleet's alert state
NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")  # node, label and user names
NAME_HINT = "use 1-64 characters from A-Z a-z 0-9 . _ -"
# A duration: `90s`, `10m`, `2h`, `3d`, `1w` (`nvmon history --since`, `nvmon alerts silence --for`).
# Units in lower case only, as documented: `5M` would read as months to some, minutes to others.
DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)\s*$")
UNIT_S = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}
UNIT_CASE_HINT = "units are lower case: s, m (minutes), h, d, w"


def unit_case_wrong(text: str) -> bool:
    """A duration but for the case of its unit ('5M', '2H')."""
    return DURATION.match(text) is None and DURATION.match(text.lower()) is not None


class NvmonError(click.ClickException):
    """A user-facing one-line error: `nvmon: <message>`, exit status 1 unless a subclass says otherwise."""

    def show(self, file=None) -> None:
        click.echo(f"nvmon: {self.format_message()}", err=True)


class NvmonUsageError(NvmonError):
    """A flag or argument given wrongly: `nvmon <command>: <message>`, exit 2, as click's usage
    errors (main() prints those the same way), but one line also where click would add the usage."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(message)
        ctx = click.get_current_context(silent=True)
        self.command = ctx.command_path if ctx is not None else "nvmon"

    def show(self, file=None) -> None:
        click.echo(f"{self.command}: {self.format_message()}", err=True)


def check_interval(ctx, param, value: float) -> float:
    if not 0.05 <= value <= 300:
        raise click.BadParameter("must be between 0.05 and 300 seconds")
    return value


def check_cluster(ctx, param, value: str | None) -> str | None:
    """A cluster name (a topic level: `nvmon.wire.contract.valid_name`), or None when not given."""
    if value is not None and not valid_name(value):
        raise click.BadParameter(NAME_HINT)
    return value


def check_broker(ctx, param, value: str | None) -> str | None:
    """A --broker URL (`nvmon.wire.mqtt.parse_broker_url`: never echoed with a password); None or
    '' (the daemon's "do not publish") as given."""
    if value:
        from nvmon.wire.mqtt import parse_broker_url

        try:
            parse_broker_url(value)
        except ValueError as e:
            if ctx.get_parameter_source(param.name) is click.core.ParameterSource.ENVIRONMENT:
                raise NvmonUsageError(f"${BROKER_ENV}: {e}") from None  # not "--broker": it was not typed
            raise click.BadParameter(str(e)) from None
    return value


def counted(n: int, noun: str) -> str:
    """'1 rack', '2 racks': a count with its noun in the right number."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def on_terminal() -> bool:
    """Is stdout a terminal? Piped output is never cut to the screen: no "…", no "and N more"."""
    import sys

    return sys.stdout.isatty()


class _PipedOut:
    """stdout for piped output: the spaces Rich pads a table's cells with are taken off the end of
    each line (a file or a diff should not carry them)."""

    def write(self, text: str) -> int:
        import re
        import sys

        return sys.stdout.write(re.sub(r"[ \t]+\n", "\n", text))

    def flush(self) -> None:
        import sys

        sys.stdout.flush()

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:  # what Rich picks its box characters by, as it would from stdout
        import sys

        return getattr(sys.stdout, "encoding", None) or "utf-8"


def stdout_console():
    """A Rich console for a command's output: a terminal's own width; piped, 200 columns, so that
    nothing is cut short for grep and friends (tables keep their natural width), and no trailing
    spaces."""
    from rich.console import Console

    if on_terminal():
        return Console(highlight=False)
    return Console(highlight=False, width=200, file=_PipedOut())


def setup_logging(level: str, fmt: str = "text") -> None:
    """The long-running commands' log lines on stderr. `fmt` "text": under systemd (JOURNAL_STREAM
    set) the journal adds the time, so lines carry none; "json": one JSON object a line
    (nvmon.cli.logformat)."""
    import logging

    if fmt == "json":
        from nvmon.cli.logformat import JsonFormatter

        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter())
        logging.basicConfig(level=level.upper(), handlers=[handler])
        return
    journald = bool(os.environ.get("JOURNAL_STREAM"))
    logging.basicConfig(
        level=level.upper(),
        format=("%(name)s: %(levelname)s: %(message)s" if journald
                else "%(asctime)s %(name)s %(levelname)s: %(message)s"),
    )


def log_options(f):
    """--log-level and --log-format, for the long-running commands (daemon, fleet)."""
    from nvmon.cli.logformat import LOG_FORMATS

    f = click.option("--log-format", type=click.Choice(LOG_FORMATS), default="text", show_default=True,
                     help="Log lines on stderr: text, or json (one object a line: time, level, logger, "
                          "message, exception) for journald / Loki.")(f)
    return click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
                        default="info", show_default=True)(f)


def load_fleet_config(path: Path | None):
    """The one reader of `--config` for `nvmon fleet` and `nvmon alerts` (a fleet file, or a daemon's:
    `nvmon.fleet.service.load_fleet_config` accepts both), its error a one-line NvmonError."""
    from nvmon.fleet.service import FleetConfigError, load_fleet_config as load

    try:
        return load(path)
    except FleetConfigError as e:
        raise NvmonError(str(e)) from None


def mqtt_settings(url: str, section=None, *, keepalive: bool = False):
    """Broker settings for `url` with an `[mqtt]` table's user, password and TLS files (None: the URL
    alone) and, with `keepalive`, its keepalive_s; a bad value is a one-line NvmonError."""
    from nvmon.wire.mqtt import MqttSettings

    def s(p):
        return None if p is None else str(p)

    m = section
    extra = {"keepalive_s": m.keepalive_s} if keepalive and m is not None else {}
    try:
        return MqttSettings(url=url, username=m.username if m else None,
                            password_file=s(m.password_file) if m else None,
                            ca_file=s(m.ca_file) if m else None, cert_file=s(m.cert_file) if m else None,
                            key_file=s(m.key_file) if m else None, tls_insecure=bool(m and m.tls_insecure),
                            **extra)
    except ValueError as e:
        raise NvmonError(str(e)) from None


def under_systemd() -> bool:
    """Started by systemd (a unit sets INVOCATION_ID; its StateDirectory= makes /var/lib/nvmon)."""
    return bool(os.environ.get("INVOCATION_ID") or os.environ.get("JOURNAL_STREAM"))


def user_state_dir() -> Path:
    """$XDG_STATE_HOME/nvmon, else ~/.local/state/nvmon (XDG base directory spec: a relative
    XDG_STATE_HOME is ignored)."""
    base = os.environ.get("XDG_STATE_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state") / "nvmon"


def resolve_db(path, default: str, *, create: bool) -> Path:
    """The database file to use for `path`. The packaged default (/var/lib/nvmon/…) whose directory
    does not exist, outside systemd: the same name in the user's state directory (made when
    `create`; a reader takes it only if it exists), said in one line on stderr. Any other path is
    used as given."""
    p = Path(path)
    if p != Path(default) or p.parent.is_dir() or under_systemd():
        return p
    alt = user_state_dir() / p.name
    if not create and not alt.exists():  # a reader: the usual "not found" names the default
        return p
    if create:
        try:
            alt.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as e:
            raise NvmonError(f"database {alt}: cannot create {alt.parent}: {e.strerror or e}") from None
    click.echo(f"nvmon: database {alt} ({p.parent} does not exist; --db to choose)", err=True)
    return alt


def check_db_writable(path) -> None:
    """Start-up check of the database a long-running command writes: a path typed wrongly fails
    here in one line, instead of in the retry loop meant for a disk that fails later."""
    p = Path(path)
    parent = p.absolute().parent
    if p.is_dir():
        raise NvmonError(f"database {p}: is a directory; give a file, e.g. {p / 'nvmon.db'}")
    if p.exists() and not p.is_file():
        raise NvmonError(f"database {p}: not a regular file")
    if not parent.exists():
        raise NvmonError(f"database {p}: directory {parent} does not exist")
    if not parent.is_dir():
        raise NvmonError(f"database {p}: {parent} is not a directory")
    for target in (parent, p) if p.exists() else (parent,):  # SQLite adds -wal, -shm and the lock beside it
        if not os.access(target, os.W_OK):
            ro = bool(os.statvfs(parent).f_flag & os.ST_RDONLY)
            raise NvmonError(f"database {p}: " + ("read-only file system" if ro else f"{target}: not writable"))
    probe = parent / f".{p.name}.nvmon-probe-{os.getpid()}"  # what access() cannot tell (root, /proc, …)
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe)
    except OSError as e:
        raise NvmonError(f"database {p}: cannot create files in {parent}: {e.strerror or e}") from None


def check_broker_files(settings) -> None:
    """Read the password and TLS files once at start: a missing or wrong one is a one-line error
    naming the file (later connections re-read them, so a rotated file is still picked up)."""
    for what, f in (("password file", settings.password_file), ("CA file", settings.ca_file),
                    ("certificate file", settings.cert_file), ("key file", settings.key_file)):
        if f is None:
            continue
        try:
            with open(f, "rb"):
                pass
            if what in ("password file", "key file"):  # secrets: private to their reader (nvmon.secretfile)
                check_private(f)
        except OSError as e:
            raise NvmonError(f"{what} {f}: {e.strerror or e}") from None
    try:
        settings.tls_context()
    except (ssl.SSLError, OSError, ValueError) as e:
        files = ", ".join(str(f) for f in (settings.ca_file, settings.cert_file, settings.key_file) if f)
        reason = re.sub(r"\s*\(_ssl\.c:\d+\)", "", str(e.args[-1] if e.args else e))  # not OpenSSL's source line
        raise NvmonError(f"TLS files ({files or 'system CAs'}): {reason}") from None


# ---- the broker flags: one set, one default, for every command that talks to a broker (docs/cli.md) ----

DEFAULT_BROKER = "mqtt://localhost:1883"  # as the [mqtt] broker default of the daemon's and fleet's configs
BROKER_ENV = "NVMON_BROKER"
# (flag, MqttSettings field, help): the table in docs/cli.md, "Common flags", lists exactly these.
BROKER_FLAGS = (
    ("--broker", "url", "mqtt://HOST[:PORT] or mqtts://HOST[:PORT]."),
    ("--username", "username", "Broker user name."),
    ("--password-file", "password_file", "File holding the broker password (never on the command line)."),
    ("--ca-file", "ca_file", "CA bundle for mqtts (default: system CAs)."),
    ("--cert-file", "cert_file", "Client certificate (mutual TLS)."),
    ("--key-file", "key_file", "Client certificate key."),
    ("--tls-insecure", "tls_insecure", "Skip the broker host name check (the chain is still verified)."),
)


class BrokerFlags:
    """The broker flags as typed (None: not given; --broker also from $NVMON_BROKER). `settings()`
    merges them over a config's `[mqtt]` table: flag or environment > config file > DEFAULT_BROKER."""

    def __init__(self, **given):
        self.given = given  # MqttSettings field → value, None when not given
        self.broker = given["url"]

    def flagged(self) -> bool:
        return any(v not in (None, False) for v in self.given.values())

    def url(self, section=None, default: str | None = DEFAULT_BROKER) -> str | None:
        if self.broker is not None:
            return self.broker
        return (section.broker if section is not None else None) or default

    def settings(self, section=None, *, default: str | None = DEFAULT_BROKER, keepalive: bool = False,
                 url: str | None = None):
        """MqttSettings for `url` (default: self.url(section, default)), the flags over `section`'s
        user, password and TLS files; a bad combination is a one-line error (usage when flags made it)."""
        from nvmon.wire.mqtt import MqttSettings

        m = section
        base = {f: (None if m is None or getattr(m, f) is None else str(getattr(m, f)))
                for f in ("username", "password_file", "ca_file", "cert_file", "key_file")}
        base["tls_insecure"] = bool(m is not None and m.tls_insecure)
        for field, value in self.given.items():
            if field != "url" and value not in (None, False):
                base[field] = value
        if keepalive and m is not None:
            base["keepalive_s"] = m.keepalive_s
        try:
            return MqttSettings(url=url or self.url(section, default), **base)
        except ValueError as e:
            raise (NvmonUsageError if self.flagged() else NvmonError)(str(e)) from None


def broker_options(f=None, *, broker_help: str | None = None, check=None):
    """Add the broker flags (BROKER_FLAGS) to a command; they reach it as one `broker: BrokerFlags`.
    `broker_help`: the command's own words on --broker (its default); $NVMON_BROKER is always said.
    `check`: --broker's callback instead of check_broker (a group whose subcommands check it)."""
    import functools

    if f is None:
        return lambda g: broker_options(g, broker_help=broker_help, check=check)
    names = [field for _, field, _ in BROKER_FLAGS]

    @functools.wraps(f)
    def command(*args, **kw):
        given = {field: kw.pop(f"_b_{field}") for field in names}
        return f(*args, broker=BrokerFlags(**given), **kw)

    for flag, field, text in reversed(BROKER_FLAGS):
        if flag == "--broker":
            opt = click.option(flag, f"_b_{field}", default=None, metavar="URL", envvar=BROKER_ENV,
                               callback=check or check_broker,
                               help=f"{text} Else ${BROKER_ENV}. {broker_help or f'Default: {DEFAULT_BROKER}.'}")
        elif flag == "--tls-insecure":
            opt = click.option(flag, f"_b_{field}", is_flag=True, default=False, help=text)
        elif flag == "--username":
            opt = click.option(flag, f"_b_{field}", default=None, metavar="NAME", help=text)
        else:
            opt = click.option(flag, f"_b_{field}", default=None, metavar="FILE",
                               type=click.Path(dir_okay=False), help=text)
        command = opt(command)
    return command
