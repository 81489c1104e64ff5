"""Acks and silences shared over MQTT (docs/alerts.md, "Shared acks and silences").

Each cluster has one retained control message, `nvmon/v1/<cluster>/@controls`, holding the
cluster's full set of silences and acks (nvmon.wire.control has the format).

- Writers — `nvmon alerts ack/silence/unsilence --broker`, the TUI's `k`/`x` — call
  `update_shared()`: read the retained set, apply one change, prune what expired, publish the whole
  set back (retained, QoS 1). Last writer wins: two writers within the same second can lose one
  change (the loser's command still printed success); the set is small and changes are rare.
- Evaluators — the daemon (through its Publisher's connection), `nvmon fleet` (through its
  FleetSubscriber's, off the sample path: nvmon.fleet.subscriber) and the TUI — feed each message
  to a `SharedControls`, which keeps the last good set per cluster (a malformed message is counted,
  logged and ignored) and gives the engine's form with `controls(now)`; `merge()` adds them to the
  node's own (SQLite) acks and silences.

A shared silence applies to its cluster only: it is handed to the engine with `cluster=<its
cluster>` added to its matchers. Anyone who can write to the broker can write a silence, so an
evaluator trusts it only so far (docs/alerts.md, "Limits on shared silences"):

- it lasts at most `max_silence_s` from its start (`[alerts] max_silence_h`, default 7 days): a
  longer one is applied only up to then;
- one that covers every node (no `node` matcher, or one naming no character: `covers_every_node`) is refused unless its
  writer set `all_nodes` (`nvmon alerts silence --all-nodes`);
- each new silence applied, cut short or refused is logged once, naming who set it and until when;
  refusals are counted (`SharedControls.refused_silences`).
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import os
import re
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from nvmon.alerts.model import Silence, iso
from nvmon.alerts.settings import DEFAULT_MAX_SILENCE_H
from nvmon.wire.contract import Alert, WireError, control_subscription, control_topic, subscription, valid_name
from nvmon.wire.control import ControlSet, SharedAck, SharedSilence, controls_payload, empty, parse_controls, read_controls
from nvmon.wire.mqtt import MqttSettings, make_client, retained_message

log = logging.getLogger("nvmon.alerts")

RETAINED_WAIT_S = 1.0  # after the subscription is confirmed, how long a reader still waits for the retained set
DEFAULT_MAX_SILENCE_S = DEFAULT_MAX_SILENCE_H * 3600.0
LOG_PER_MESSAGE = 10  # new silences logged one by one per control message; the rest summed up
LINES_PER_MIN = 40  # lines a minute about sets and silences applied, at most (a flood is counted, not logged)
_GLOB = re.compile(r"[*?\[]")
# Every character a node name may hold, as the wire contract says (`...` is a name, `.` is not).
NAME_CHARS = "".join(c for c in map(chr, range(128)) if valid_name(c * 3))
Acks = dict[tuple[str, int], float]


def new_silence_id() -> str:
    return secrets.token_hex(4)


def ack_key(fingerprint: str, starts_at: float) -> tuple[str, int]:
    return fingerprint, round(starts_at * 1000)


def engine_controls(cs: ControlSet, now: float) -> tuple[Acks, list[Silence]]:
    """A cluster's shared set as `AlertEngine.set_controls` takes it; silences scoped to the cluster."""
    acks = {ack_key(a.fingerprint, a.starts_at): a.acked_at for a in cs.acks}
    silences = [Silence(id=f"{cs.cluster}/{s.id}", matchers={**s.matchers, "cluster": cs.cluster}, starts_at=s.starts_at,
                        ends_at=s.ends_at, created_by=s.created_by, comment=s.comment)
                for s in cs.silences if s.ends_at > now]
    return acks, silences


def covers_every_node(matchers: Mapping[str, str]) -> bool:
    """Whether a silence reaches every node's alerts: no `node` matcher, or a node pattern that names
    no character of a node's name (only `*`, `?` and `[...]` classes that admit every character a
    node name may hold: `*`, `?*`, `??*`, `[!/]*`, `???`). Such a pattern picks nodes by the length of
    their names at most, and one naming scheme gives a fleet names of one length (`???????` is every
    `gpu-001`…`gpu-999`), so it counts as every node. A pattern with any character in it (`*-*`,
    `gpu-*`, `[a-f]*`) is a subset. A `fingerprint` without wildcards names one alert (of one node or
    rack): never every node."""
    fp = matchers.get("fingerprint")
    if fp is not None and not _GLOB.search(fp):
        return False
    pattern = matchers.get("node")
    return pattern is None or _names_no_character(pattern)


def _names_no_character(pattern: str) -> bool:
    """True when every token of the glob (fnmatch's grammar: `*`, `?`, `[...]`, `[!...]`, a literal)
    admits every character of a node name, i.e. the pattern constrains a name's length at most.
    Each token is tried with fnmatch itself, so its class syntax (ranges, `!`, a leading `]`) is
    fnmatch's, never a second reading of it."""
    tokens, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "[":  # as fnmatch.translate finds a class's end; without one, `[` is a literal
            j = i + 1
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j < n:
                tokens.append(pattern[i:j + 1])
                i = j + 1
                continue
        if c != "*":
            tokens.append(c)
        i += 1
    return bool(pattern) and all(fnmatch.fnmatchcase(ch, t) for t in tokens for ch in NAME_CHARS)


def judged(s: SharedSilence, max_silence_s: float = DEFAULT_MAX_SILENCE_S) -> float | None:
    """Until when an evaluator applies `s` (its ends_at, or cut to starts_at + max_silence_s);
    None when it refuses it (it covers every node without `all_nodes`)."""
    if covers_every_node(s.matchers) and not s.all_nodes:
        return None
    return min(s.ends_at, s.starts_at + max_silence_s)


def _describe(s: SharedSilence) -> str:
    what = " ".join(f"{k}={v}" for k, v in s.matchers.items())
    return f"{s.id} by {s.created_by or 'an unnamed writer'} until {iso(s.ends_at)} ({what[:200]})"


def merge(*sources: tuple[Mapping[tuple[str, int], float], Iterable[Silence]]) -> tuple[Acks, list[Silence]]:
    """Union of (acks, silences) pairs; an episode acked in several places keeps the first ack."""
    acks: Acks = {}
    silences: list[Silence] = []
    for a, s in sources:
        for k, v in a.items():
            acks[k] = min(v, acks.get(k, v))
        silences += list(s)
    return acks, silences


class SharedControls:
    """The last good control set of each cluster seen. `apply(topic, payload)` is the message
    callback: cheap, synchronous, never raises."""

    def __init__(self, on_change: Callable[[], None] | None = None, *,
                 max_silence_s: float = DEFAULT_MAX_SILENCE_S):
        self.sets: dict[str, ControlSet] = {}  # as applied: silences capped, refused ones left out
        self.received_sets: dict[str, ControlSet] = {}  # as received (what each new message is compared with)
        self.on_change = on_change
        self.max_silence_s = max_silence_s
        self.received = 0
        self.malformed = 0  # refused messages (each logged; the previous set stays in force)
        self.refused_silences = 0  # silences covering every node without `all_nodes` (each logged once)
        self.capped_silences = 0  # silences longer than max_silence_s, applied only up to it
        self.last_error: str | None = None
        self._said: list[float] = []  # monotonic times of the lines about applied controls in the last minute
        self._unsaid = 0  # such lines left out since the last one logged (more than LINES_PER_MIN a minute)

    def apply(self, topic: str, payload: bytes) -> bool:
        self.received += 1
        try:
            cs = parse_controls(topic, payload)
        except WireError as e:
            self.malformed += 1
            self.last_error = str(e)
            if self.malformed <= 10 or self.malformed % 1000 == 0:
                log.warning("alerts: shared controls on %s refused (%d so far), the previous set stays: %s",
                            str(topic)[:120], self.malformed, e)
            return False
        prev = self.received_sets.get(cs.cluster)
        self.sets[cs.cluster] = self._vet(cs)
        self.received_sets[cs.cluster] = cs
        if prev is None or (prev.silences, prev.acks) != (cs.silences, cs.acks):
            self._say(logging.INFO, f"shared controls of cluster {cs.cluster}: {len(cs.silences)} silence(s), "
                      f"{len(cs.acks)} ack(s)")
        if self.on_change is not None:
            try:
                self.on_change()
            except Exception:  # the owner's callback: never let it break the connection's reader
                log.exception("alerts: shared controls callback failed")
        return True

    def _say(self, level: int, line: str) -> None:
        """Log `line` (the sets and silences applied), at most LINES_PER_MIN lines a minute: a
        writer that floods the topic does not flood the journal; the lines left out are counted
        in the next one that is logged."""
        now = time.monotonic()
        self._said = [t for t in self._said if now - t < 60.0]
        if len(self._said) >= LINES_PER_MIN:
            if self._unsaid == 0:  # said once when it starts, so that a flood shows at once
                log.warning("alerts: more than %d lines a minute about shared controls (a writer flooding the "
                            "control topic?): the rest are left out, and counted in the next line", LINES_PER_MIN)
            self._unsaid += 1
            return
        self._said.append(now)
        more = f" [{self._unsaid} lines about shared controls left out before this one: more than " \
               f"{LINES_PER_MIN} a minute]" if self._unsaid else ""
        self._unsaid = 0
        log.log(level, "alerts: %s%s", line, more)

    def _vet(self, cs: ControlSet) -> ControlSet:
        """`cs` as applied: refuse silences covering every node without `all_nodes`, cut those
        lasting longer than max_silence_s; log each silence not in the cluster's previous set once."""
        prev = self.received_sets.get(cs.cluster)
        before = {s.id: s for s in (prev.silences if prev is not None else ())}
        keep, lines = [], []
        for s in cs.silences:
            new = before.get(s.id) != s
            cap = judged(s, self.max_silence_s)
            if cap is None:
                if new:
                    self.refused_silences += 1
                    lines.append((logging.WARNING, f"shared silence {_describe(s)} of cluster {cs.cluster} refused: it "
                                  "covers every node and was not set with --all-nodes"))
                continue
            if s.ends_at > cap:
                if new:
                    self.capped_silences += 1
                    lines.append((logging.WARNING, f"shared silence {_describe(s)} of cluster {cs.cluster} applied "
                                  f"only until {iso(cap)}: longer than the maximum ({self.max_silence_s / 3600:g} h)"))
                s = replace(s, ends_at=cap)
            elif new:
                lines.append((logging.INFO, f"shared silence {_describe(s)} of cluster {cs.cluster} applied"))
            keep.append(s)
        for level, line in lines[:LOG_PER_MESSAGE]:
            self._say(level, line)
        if len(lines) > LOG_PER_MESSAGE:
            self._say(logging.WARNING, f"{len(lines) - LOG_PER_MESSAGE} more new shared silences in cluster "
                      f"{cs.cluster} ({self.refused_silences} refused so far, {self.capped_silences} cut short)")
        return replace(cs, silences=tuple(keep))

    def controls(self, now: float) -> tuple[Acks, list[Silence]]:
        return merge(*(engine_controls(cs, now) for cs in self.sets.values()))


# --- writers ------------------------------------------------------------------------------------


def _client_id(what: str) -> str:
    return f"nvmon-{what}-{os.getpid()}-{secrets.token_hex(2)}"


async def update_shared(settings: MqttSettings, cluster: str, change: Callable[[ControlSet], ControlSet], *,
                        wait_s: float = RETAINED_WAIT_S, clock: Callable[[], float] = time.time) -> ControlSet:
    """Read the cluster's retained set, apply `change`, prune, publish it back; returns the set
    published. Raises WireError if the retained set cannot be read (it is not overwritten: clear
    it with `mosquitto_pub -r -n -t TOPIC` if it is garbage) and the client's errors (MqttError,
    OSError: `describe_error` words them) if the broker cannot be reached."""
    topic = control_topic(cluster)
    async with make_client(settings, client_id=settings.client_id or _client_id("controls")) as client:
        current = await retained_message(client, topic, grace_s=wait_s)
        try:
            cs = empty(cluster) if current is None else read_controls(cluster, current)
        except WireError as e:
            raise WireError(f"the retained set on {topic} is not readable ({e}); not overwritten") from None
        new = change(cs).pruned(clock())
        await client.publish(topic, controls_payload(new), qos=1, retain=True)
    return new


async def read_shared(settings: MqttSettings, cluster: str, *, wait_s: float = RETAINED_WAIT_S) -> ControlSet:
    """The cluster's retained set as it is now (empty if there is none). Raises like update_shared."""
    topic = control_topic(cluster)
    async with make_client(settings, client_id=settings.client_id or _client_id("controls")) as client:
        current = await retained_message(client, topic, grace_s=wait_s)
    return empty(cluster) if current is None else read_controls(cluster, current)


async def _retained(client, wait_s: float, quiet_s: float):
    """The messages a subscription brings (the retained ones first), until `wait_s` has passed or
    none came for `quiet_s`."""
    loop = asyncio.get_running_loop()
    deadline, last = loop.time() + wait_s, None
    while True:
        until = deadline if last is None else min(deadline, last + quiet_s)
        if until <= loop.time():
            return
        try:
            async with asyncio.timeout(until - loop.time()):
                m = await anext(aiter(client.messages))
        except TimeoutError:
            return
        last = loop.time()
        yield m


async def read_every_shared(settings: MqttSettings, *, wait_s: float = RETAINED_WAIT_S,
                            quiet_s: float = 0.3) -> list[ControlSet]:
    """Every cluster's retained set, by cluster name (what `nvmon alerts silences --broker` lists
    without --cluster, as `ack` searches every cluster). Reads like find_alerts."""
    from nvmon.wire.contract import parse_control_topic

    found: dict[str, ControlSet] = {}
    async with make_client(settings, client_id=settings.client_id or _client_id("controls")) as client:
        await client.subscribe(control_subscription(None), qos=1)
        async for m in _retained(client, wait_s, quiet_s):
            try:
                cluster = parse_control_topic(m.topic)
                found[cluster] = read_controls(cluster, bytes(m.payload))
            except (WireError, ValueError):  # someone else's junk on the topic: not ours to list
                continue
    return [found[c] for c in sorted(found)]


async def find_alerts(settings: MqttSettings, prefix: str, *, cluster: str | None = None,
                      wait_s: float = RETAINED_WAIT_S, quiet_s: float = 0.3) -> list[tuple[str, str, Alert]]:
    """Active alerts whose fingerprint starts with `prefix`, from the nodes' retained `alerts`
    sets: (cluster, node, alert). Reads until `wait_s` passed or `quiet_s` without a message."""
    from nvmon.wire.parse import parse_message

    found: dict[tuple[str, str, str], Alert] = {}
    async with make_client(settings, client_id=settings.client_id or _client_id("find")) as client:
        await client.subscribe(subscription(cluster, None, "alerts"), qos=1)
        async for m in _retained(client, wait_s, quiet_s):
            try:
                msg = parse_message(str(m.topic), bytes(m.payload))
            except WireError:
                continue
            for a in msg.alerts:
                if a.fingerprint.startswith(prefix):
                    found[(msg.cluster, msg.node, a.fingerprint)] = a
    return [(c, n, a) for (c, n, _), a in sorted(found.items())]


def shared_ack(fingerprint: str, starts_at: float, now: float, by: str | None) -> Callable[[ControlSet], ControlSet]:
    return lambda cs: cs.with_ack(SharedAck(fingerprint=fingerprint, starts_at=starts_at, acked_at=now, by=by))


def shared_silence(matchers: dict[str, str], starts_at: float, ends_at: float, by: str | None,
                   comment: str | None, silence_id: str | None = None, *,
                   all_nodes: bool = False) -> tuple[str, Callable[[ControlSet], ControlSet]]:
    sid = silence_id or new_silence_id()
    s = SharedSilence(id=sid, matchers=dict(matchers), starts_at=starts_at, ends_at=ends_at, created_by=by,
                      comment=comment, all_nodes=all_nodes)
    return sid, lambda cs: cs.with_silence(s)
