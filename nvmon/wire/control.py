"""Shared acks and silences: the retained `nvmon/v1/<cluster>/@controls` message (docs/wire.md).

One message per cluster carries the cluster's whole current set — silences and acks — so a
late subscriber (a restarted daemon, a new `nvmon fleet`) knows everything from the retained copy.
Writers (`nvmon alerts ack/silence --broker`, the TUI) read the retained set, change it, prune it
and publish it back: full set, last writer wins (docs/alerts.md, "Shared acks and silences").

Pure data, no I/O and no knowledge of the alert engine: `nvmon.alerts.shared` turns a
`ControlSet` into the engine's acks and silences. `parse_controls` is as strict as `parse`:
anything off-contract raises `WireError` (one line), and the reader keeps its last good set.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from nvmon.wire.checks import MAX_TS, array, envelope, number, obj, text
from nvmon.wire.contract import MAX_NAME, SCHEMA, PayloadTooLarge, WireError, parse_control_topic
from nvmon.wire.payloads import encode

MAX_SILENCES = 500
MAX_ACKS = 2000
MAX_MATCHERS = 16
MAX_MATCH_VALUE = 256
MAX_COMMENT = 512
ACK_KEEP_S = 7 * 86400  # writers drop acks older than this: their episode is long over
_KEY = re.compile(r"[A-Za-z0-9._-]{1,64}")
_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_FP = re.compile(r"[0-9a-f]{4,64}")


@dataclass(frozen=True, slots=True)
class SharedSilence:
    """Alerts of the cluster whose fields/labels match every matcher (shell-style globs) are not
    paged from `starts_at` until `ends_at` (unix s). `all_nodes` is the writer's explicit
    consent (`nvmon alerts silence --all-nodes`) to a silence whose matchers cover every node:
    evaluators refuse such a silence without it (nvmon.alerts.shared). On the wire the key
    `"all_nodes": true` is present only when set; readers before it ignore the key."""

    id: str
    matchers: dict[str, str]
    starts_at: float
    ends_at: float
    created_by: str | None = None
    comment: str | None = None
    all_nodes: bool = False


@dataclass(frozen=True, slots=True)
class SharedAck:
    """One alert episode acknowledged: (fingerprint, episode start) → when and by whom."""

    fingerprint: str
    starts_at: float  # the episode's start (unix s, ms precision): a new episode is not acked
    acked_at: float
    by: str | None = None


@dataclass(frozen=True, slots=True)
class ControlSet:
    cluster: str
    ts: float  # when the writer built it
    silences: tuple[SharedSilence, ...] = ()
    acks: tuple[SharedAck, ...] = ()

    # -- changes (writers) ---------------------------------------------------------------------

    def with_silence(self, s: SharedSilence) -> ControlSet:
        return replace(self, silences=tuple(x for x in self.silences if x.id != s.id) + (s,))

    def without_silence(self, silence_id: str) -> ControlSet:
        return replace(self, silences=tuple(x for x in self.silences if x.id != silence_id))

    def with_ack(self, a: SharedAck) -> ControlSet:
        key = (a.fingerprint, round(a.starts_at * 1000))
        keep = tuple(x for x in self.acks if (x.fingerprint, round(x.starts_at * 1000)) != key)
        return replace(self, acks=keep + (a,))

    def pruned(self, now: float) -> ControlSet:
        """Without expired silences and acks older than ACK_KEEP_S; at most MAX_SILENCES /
        MAX_ACKS (the longest-lasting silences and newest acks are kept)."""
        silences = sorted((s for s in self.silences if s.ends_at > now), key=lambda s: -s.ends_at)[:MAX_SILENCES]
        acks = sorted((a for a in self.acks if a.acked_at >= now - ACK_KEEP_S), key=lambda a: -a.acked_at)[:MAX_ACKS]
        return replace(self, ts=now, silences=tuple(sorted(silences, key=lambda s: s.starts_at)),
                       acks=tuple(sorted(acks, key=lambda a: a.acked_at)))

    def silence(self, silence_id: str) -> SharedSilence | None:
        return next((s for s in self.silences if s.id == silence_id), None)


def empty(cluster: str, ts: float = 0.0) -> ControlSet:
    return ControlSet(cluster=cluster, ts=ts)


# --- writing ----------------------------------------------------------------------------------


def _silence_dict(s: SharedSilence) -> dict:
    return {"id": s.id, "matchers": dict(s.matchers), "starts_at": round(s.starts_at, 3),
            "ends_at": round(s.ends_at, 3), "created_by": s.created_by, "comment": s.comment,
            **({"all_nodes": True} if s.all_nodes else {})}


def _ack_dict(a: SharedAck) -> dict:
    return {"fingerprint": a.fingerprint, "starts_at": round(a.starts_at, 3), "acked_at": round(a.acked_at, 3),
            "by": a.by}


def controls_payload(cs: ControlSet) -> bytes:
    """The message for `cs`, checked by the reader's own rules (a writer never publishes what
    evaluators would refuse). When it would exceed the size limit, the oldest acks and then the
    soonest-ending silences are left out; PayloadTooLarge only if even that cannot help."""
    while True:
        try:
            body = encode({"schema": SCHEMA, "ts": round(cs.ts, 3), "cluster": cs.cluster,
                           "silences": [_silence_dict(s) for s in cs.silences],
                           "acks": [_ack_dict(a) for a in cs.acks]})
            break
        except PayloadTooLarge:
            pass
        if cs.acks:
            cs = replace(cs, acks=tuple(sorted(cs.acks, key=lambda a: a.acked_at)[max(1, len(cs.acks) // 8):]))
        elif cs.silences:
            cs = replace(cs, silences=tuple(sorted(cs.silences, key=lambda s: s.ends_at)[1:]))
        else:
            raise PayloadTooLarge("control set does not fit the payload limit")
    read_controls(cs.cluster, body)  # raises WireError for anything a reader would refuse
    return body


# --- reading ----------------------------------------------------------------------------------


def _silence(v: object, path: str) -> SharedSilence:
    d = obj(v, path)
    sid = text(d.get("id"), f"{path}.id", MAX_NAME, null=False)
    if not _ID.fullmatch(sid):
        raise WireError(f"{path}.id: use 1-64 of A-Z a-z 0-9 . _ -")
    raw = obj(d.get("matchers"), f"{path}.matchers", MAX_MATCHERS)
    if not raw:
        raise WireError(f"{path}.matchers: at least one matcher")
    matchers = {}
    for k, x in raw.items():
        if not _KEY.fullmatch(k):
            raise WireError(f"{path}.matchers: key {k[:20]!r} is not a field or label name")
        matchers[k] = text(x, f"{path}.matchers.{k}", MAX_MATCH_VALUE, null=False)
    starts = number(d.get("starts_at"), f"{path}.starts_at", 0, MAX_TS, null=False)
    ends = number(d.get("ends_at"), f"{path}.ends_at", 0, MAX_TS, null=False)
    if ends <= starts:
        raise WireError(f"{path}: ends_at is not after starts_at")
    all_nodes = d.get("all_nodes", False)
    if type(all_nodes) is not bool:
        raise WireError(f"{path}.all_nodes: expected true or false")
    return SharedSilence(id=sid, matchers=matchers, starts_at=starts, ends_at=ends,
                         created_by=text(d.get("created_by"), f"{path}.created_by", MAX_NAME),
                         comment=text(d.get("comment"), f"{path}.comment", MAX_COMMENT), all_nodes=all_nodes)


def _ack(v: object, path: str) -> SharedAck:
    d = obj(v, path)
    fp = text(d.get("fingerprint"), f"{path}.fingerprint", MAX_NAME, null=False)
    if not _FP.fullmatch(fp):
        raise WireError(f"{path}.fingerprint: expected lower-case hex digits")
    return SharedAck(fingerprint=fp, starts_at=number(d.get("starts_at"), f"{path}.starts_at", 0, MAX_TS, null=False),
                     acked_at=number(d.get("acked_at"), f"{path}.acked_at", 0, MAX_TS, null=False),
                     by=text(d.get("by"), f"{path}.by", MAX_NAME))


def read_controls(cluster: str, payload: object) -> ControlSet:
    """Decode the control message of `cluster`; an empty payload (a cleared retained topic) is the
    empty set. Raises WireError (one line) for anything off-contract."""
    if isinstance(payload, (bytes, bytearray, memoryview)) and len(payload) == 0:
        return empty(cluster)
    d = envelope(payload, "controls", cluster)
    silences = tuple(_silence(x, f"silences[{i}]")
                     for i, x in enumerate(array(d.get("silences", []), "silences", MAX_SILENCES)))
    if len({s.id for s in silences}) != len(silences):
        raise WireError("silences: an id repeats")
    acks = tuple(_ack(x, f"acks[{i}]") for i, x in enumerate(array(d.get("acks", []), "acks", MAX_ACKS)))
    return ControlSet(cluster=cluster, ts=number(d.get("ts"), "ts", 0, MAX_TS, null=False), silences=silences,
                      acks=acks)


def parse_controls(topic: object, payload: object) -> ControlSet:
    """`parse_message` for the control topic: validates topic and payload; raises WireError."""
    return read_controls(parse_control_topic(topic), payload)
