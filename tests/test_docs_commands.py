"""Every ```sh block of README.md and docs/*.md, run as written (issue 15: "every command in README and
docs runs verbatim in a fresh shell after README's set-up line").

The convention (also in docs/cli.md, "Commands in these docs"): a shell block is fenced ```sh and is
run verbatim unless its info string carries one marker, one of MARKERS:

    ```sh           run with `bash -e`; must exit 0 (within RUN_TIMEOUT_S)
    ```sh long      runs until stopped (a daemon, a TUI, a subscriber): run for LONG_S seconds on a
                    terminal (80×24 pty); must still be running then, and print no traceback
    ```sh usage     a synopsis, a transcript with its output (`$ ` lines), or an example whose values
                    are someone's site (a broker host, a node address, a fingerprint): not run; each
                    `nvmon …` line must name a real command and only options that command has (a
                    `python script.py --flag` line: the script exists and knows the flag)
    ```sh root      needs root on the machine it is about (sudo, /etc, systemd units, apt-get)
    ```sh hardware  needs a real GPU/InfiniBand node (the hardware kit: also the package index)
    ```sh setup     creates the venv and installs nvmon, builds the wheel, or runs this test suite:
                    not rerun from inside it. `.ci/run` runs README's test command verbatim (its
                    venv and install included; tests/test_install_docs.py checks the line is the
                    same), tests/test_demo.py runs `nvmon demo` in a real terminal (tmux), and
                    tests/test_install_docs.py builds the wheel as docs/install.md says and checks
                    that the quick subset names real test files

root, hardware and setup blocks are skipped with that reason (docs/install.md's "Securing nvmon"
root blocks are run, with /etc moved, by tests/test_securing_docs.py). Output, diagrams and
configuration stay untyped or ```text / ```toml …; test_no_shell_hides_outside_an_sh_block fails on
an untyped block that holds commands, and test_every_sh_block_has_a_known_marker on a new marker.

How a block is run: as a user who followed README's set-up line and `. .venv/bin/activate` in a
fresh shell, from a fresh clone: the working directory is a copy of the tracked files, PATH starts
with the venv's bin, and HOME, XDG_*_HOME and TMPDIR point into the test's tmp directory (nothing
else of the caller's environment is passed on, no NVMON_* variable). The blocks run in document
order, README first, in that one sandbox, so a later block sees what an earlier one left (the
history README's daemon wrote, found again by docs/store.md's `nvmon history`). A skipped `root`
block that installs mosquitto leaves, as Debian's package does, a Mosquitto on localhost:1883: the
test starts one there (tests/mqtt_broker.py) for the rest of that document, and skips the blocks
that need it when the port is taken. Background jobs a block leaves (`cmd &`) are ended with it."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import termios
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from mqtt_broker import MOSQUITTO, Broker

from nvmon.cli import cli

# The blocks run in document order in one shared sandbox (docs/store.md reads README's daemon's
# history): under pytest-xdist the whole module goes to one worker, in order (--dist loadgroup).
pytestmark = pytest.mark.xdist_group("docs-commands")

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
VENV_BIN = REPO / ".venv" / "bin"
MARKERS = {
    "": None,
    "long": None,
    "usage": None,
    "root": "root: needs root on the machine it is about (sudo, /etc, systemd units, apt-get)",
    "hardware": "hardware: needs a real GPU/InfiniBand node (the hardware kit: also the package index)",
    "setup": "setup: installs nvmon or runs the test suite (.ci/run, tests/test_install_docs.py, tests/test_demo.py)",
}
RUN_TIMEOUT_S = 30
LONG_S = 3.5
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^`\n]*)$")
# A line of a non-sh block that reads as a command (a prompt, or a program a reader would type).
COMMANDISH = re.compile(r"^\s*(\$ |nvmon |sudo |systemctl |journalctl |systemd-analyze |\.venv/bin/|python3? |"
                        r"pip |pipx |bash |mosquitto(_sub|_pub|_passwd)? |promtool |curl |apt-get |ssh )")
SHELLISH_LANGS = {"bash", "shell", "console", "zsh", "shell-session", "shellsession", "sh-session"}
# External programs a runnable block may call: missing ones skip it ("not installed", which CI=true fails).
TOOLS = ("mosquitto_sub", "mosquitto_pub", "mosquitto", "promtool", "tmux", "openssl")
BROKER_PORT = 1883


@dataclass(frozen=True)
class Block:
    doc: str  # README.md, docs/install.md
    line: int  # the opening fence's line, 1-based
    lang: str
    marker: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def parse(path: Path) -> list[Block]:
    """The fenced blocks of one Markdown file, in order (CommonMark: a fence closes on the same
    character, at least as long, with nothing after it)."""
    doc = str(path.relative_to(REPO))
    lines = path.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent = m["fence"], len(m["indent"])
        words = m["info"].split()
        body, j = [], i + 1
        while j < len(lines) and not re.fullmatch(rf" *{re.escape(fence[0])}{{{len(fence)},}} *", lines[j]):
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        out.append(Block(doc, i + 1, words[0] if words else "", " ".join(words[1:]), "\n".join(body) + "\n"))
        i = j + 1
    return out


ALL = [b for p in DOCS for b in parse(p)]
SH = [b for b in ALL if b.lang == "sh"]


def test_every_sh_block_has_a_known_marker():
    bad = [f"{b.id}: ```sh {b.marker}" for b in SH if b.marker not in MARKERS]
    assert not bad, f"unknown marker (known: {sorted(m for m in MARKERS if m)}): {bad}"
    shellish = [f"{b.id}: ```{b.lang}" for b in ALL if b.lang in SHELLISH_LANGS]
    assert not shellish, f"shell blocks are fenced ```sh (with a marker if they cannot run here): {shellish}"
    assert len(SH) >= 40 and {b.marker for b in SH} == set(MARKERS), "the convention is in use"


def test_no_shell_hides_outside_an_sh_block():
    """An untyped (or ```text) block that holds commands would escape the run below."""
    hidden = [f"{b.id}: {line.strip()}" for b in ALL if b.lang in ("", "text")
              for line in b.text.splitlines() if COMMANDISH.match(line)]
    assert not hidden, "commands outside an ```sh block (fence them ```sh, with a marker if need be):\n" + \
        "\n".join(hidden)
    assert COMMANDISH.match("$ nvmon hooks test") and COMMANDISH.match("sudo systemctl reload mosquitto")
    assert not COMMANDISH.match("nvmon/v1/<cluster>/<node>/status") and not COMMANDISH.match("nvmon: 1 failed")


# ---------------------------------------------------------------------------------------------------
# The sandbox: one fresh clone and home for the whole run, blocks in document order.


class Sandbox:
    def __init__(self, root: Path):
        self.root = root
        self.clone = root / "clone"
        files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True).stdout
        for name in filter(None, files.decode().split("\0")):
            src = REPO / name
            if src.is_file() and not src.is_symlink():
                (self.clone / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, self.clone / name)
        home = root / "home"
        dirs = {"HOME": home, "XDG_CONFIG_HOME": home / ".config", "XDG_STATE_HOME": home / ".local" / "state",
                "XDG_DATA_HOME": home / ".local" / "share", "XDG_CACHE_HOME": home / ".cache",
                "XDG_RUNTIME_DIR": root / "run", "TMPDIR": root / "tmp"}
        for d in dirs.values():
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.env = {k: str(v) for k, v in dirs.items()}
        self.env.update(PATH=f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}", VIRTUAL_ENV=str(VENV_BIN.parent),
                        LANG="C.UTF-8", LC_ALL="C.UTF-8", TERM="xterm-256color", COLUMNS="80", LINES="24")
        self.scripts = root / "blocks"
        self.scripts.mkdir()
        self.broker: Broker | None = None
        self.broker_doc: str | None = None
        self.broker_refused: str | None = None

    def script(self, block: Block) -> Path:
        path = self.scripts / (block.id.replace("/", "_").replace(":", "_") + ".sh")
        path.write_text(block.text)
        return path

    def before(self, block: Block) -> None:
        """Ends the previous document's stand-in broker when a new document begins."""
        if self.broker_doc not in (None, block.doc):
            self.stop_broker()

    def stand_in_broker(self, block: Block) -> None:
        """A skipped root block installed mosquitto: Debian's package starts it on port 1883."""
        if self.broker is not None or MOSQUITTO is None:
            return
        self.broker_doc, self.broker_refused = block.doc, None
        try:
            with socket.create_connection(("127.0.0.1", BROKER_PORT), timeout=0.2):
                self.broker_refused = f"port {BROKER_PORT} is taken on this machine"
                return
        except OSError:
            pass
        self.broker = Broker(self.root, port=BROKER_PORT)
        self.broker.start()

    def stop_broker(self) -> None:
        if self.broker is not None:
            self.broker.stop()
        self.broker, self.broker_doc, self.broker_refused = None, None, None


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    box = Sandbox(tmp_path_factory.mktemp("docs-commands"))
    yield box
    box.stop_broker()


def kill_group(proc: subprocess.Popen, *, ctrl_c: bool = False) -> None:
    """Ends the block's process group: Ctrl-C first for a long block (as its user stops it; SIGTERM
    or the terminal's SIGHUP would not let a daemon say goodbye), then SIGTERM, then SIGKILL."""
    signals = ((signal.SIGINT, 3),) if ctrl_c else ()
    for sig, wait in (*signals, (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                proc.poll()
                return
            proc.poll()
            time.sleep(0.05)


def report(block: Block, what: str, output: str) -> str:
    return f"{block.id}: {what}\n--- block\n{block.text}--- output (last 4000 characters)\n{output[-4000:]}"


def run_block(box: Sandbox, block: Block) -> None:
    log = box.scripts / (block.id.replace("/", "_").replace(":", "_") + ".out")
    with open(log, "wb") as out:
        proc = subprocess.Popen(["bash", "-e", str(box.script(block))], cwd=box.clone, env=box.env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            kill_group(proc)  # and anything it left in the background
    output = log.read_text(errors="replace")
    assert rc is not None, report(block, f"still running after {RUN_TIMEOUT_S} s (mark it ```sh long?)", output)
    assert rc == 0, report(block, f"exit status {rc}", output)
    assert "Traceback (most recent call last)" not in output, report(block, "a traceback", output)


def run_long(box: Sandbox, block: Block) -> None:
    """On a pseudo-terminal of 80×24 (a TUI needs one), for LONG_S seconds."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    chunks: list[bytes] = []

    def drain():
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    proc = subprocess.Popen(["bash", "-e", str(box.script(block))], cwd=box.clone, env=box.env, stdin=slave,
                            stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    reader.start()
    try:
        time.sleep(LONG_S)
        rc = proc.poll()
    finally:
        kill_group(proc, ctrl_c=True)
        reader.join(5)
        os.close(master)
    output = b"".join(chunks).decode(errors="replace")
    (box.scripts / (block.id.replace("/", "_").replace(":", "_") + ".out")).write_text(output)
    assert rc is None, report(block, f"exited with status {rc} within {LONG_S} s; it should run until stopped", output)
    assert "Traceback (most recent call last)" not in output, report(block, "a traceback", output)


def command_lines(text: str) -> list[str]:
    """The commands of a usage block: `nvmon …` or `$ …` lines, with `\\` continuations and the
    indented `[--flag …]` lines under a synopsis joined on."""
    out: list[str] = []
    joining = False
    for line in text.splitlines():
        if joining or (out and re.match(r"^\s+[\[-]", line) and not out[-1].startswith("$ ")):
            out[-1] += " " + line.strip().rstrip("\\")
        elif line.startswith(("nvmon ", "$ ")):
            out.append(line.rstrip().rstrip("\\"))
        joining = line.rstrip().endswith("\\") and bool(out)
    return [x[2:] if x.startswith("$ ") else x for x in out]


def options_of(cmd: click.Command) -> set[str]:
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help", "-h"}


def resolve(words: list[str]) -> tuple[click.Command, list[str], str | None]:
    """The command `nvmon WORD…` names: (command, its path, the first word a group has no
    command for, or None). Stops at the first option or `[`."""
    cmd, path = cli, ["nvmon"]
    for w in words[1:]:
        if not isinstance(cmd, click.Group) or w.startswith(("-", "[")):
            break
        sub = cmd.commands.get(w)
        if sub is None:
            return cmd, path, w
        cmd, path = sub, [*path, w]
    return cmd, path, None


def check_usage(block: Block) -> None:
    lines = command_lines(block.text)
    assert lines, f"{block.id}: a usage block with no `nvmon …` or `$ …` line"
    for line in lines:
        words = line.split("  #")[0].split()
        flags = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", line.split(" #")[0]))
        if words[0] == "nvmon":
            cmd, path, _ = resolve(words)
            assert not isinstance(cmd, click.Group) or cmd.invoke_without_command, \
                f"{block.id}: `{line}`: no such command ({' '.join(path)} …)"
            unknown = flags - options_of(cmd)
            assert not unknown, f"{block.id}: `{line}`: {' '.join(path)} has no {sorted(unknown)}"
        else:
            argv = shlex.split(line.split("  #")[0])
            script = next((a for a in argv if a.endswith(".py")), None)
            assert script and (REPO / script).is_file(), f"{block.id}: `{line}`: no such script"
            source = (REPO / script).read_text()
            unknown = {f for f in flags if f.startswith("--") and f'"{f}"' not in source}
            assert not unknown, f"{block.id}: `{line}`: {script} has no {sorted(unknown)}"


def missing_tool(block: Block, env: dict[str, str]) -> str | None:
    for tool in TOOLS:
        if re.search(rf"(^|[\s;&|(]){tool}(\s|$)", block.text, re.M) and not shutil.which(tool, path=env["PATH"]):
            return tool
    return None


@pytest.mark.parametrize("block", SH, ids=[b.id for b in SH])
def test_the_block_runs_as_written(block: Block, sandbox: Sandbox):
    sandbox.before(block)
    if block.marker == "root" and re.search(r"apt-get install\b.*\bmosquitto\b", block.text):
        sandbox.stand_in_broker(block)
    if block.marker == "usage":
        check_usage(block)
        return
    if MARKERS.get(block.marker):
        pytest.skip(MARKERS[block.marker])
    tool = missing_tool(block, sandbox.env)
    if tool:
        pytest.skip(f"{tool} not installed")
    if sandbox.broker_refused and block.doc == sandbox.broker_doc:
        pytest.skip(f"needs the Mosquitto on localhost:{BROKER_PORT} the root block installs: {sandbox.broker_refused}")
    if re.search(rf"mosquitto -p {BROKER_PORT}\b", block.text):
        try:
            with socket.create_connection(("127.0.0.1", BROKER_PORT), timeout=0.2):
                pytest.skip(f"starts a Mosquitto on port {BROKER_PORT}, which is taken on this machine")
        except OSError:
            pass
    (run_long if block.marker == "long" else run_block)(sandbox, block)
