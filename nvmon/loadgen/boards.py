"""The load generator's board pool: a few real simulated boards whose ticks many nodes reuse.

A full SimNode + NodeSampler costs ~12 ms a tick and `sample_payload` ~0.6 ms, so 1,000 nodes
each running their own would need more than a core for the payloads alone. Instead each distinct
board spec (a few healthy seeds, one per fault spec) runs once per interval, and every node on it
publishes that board's payload with only what must differ patched in: `ts` (the node's own
publish time) and `lay` (a node's GPUs have their own UUIDs, so its layout id differs). The node's
name lives in the topic, not the payload. Patching splices bytes (~2 µs a node) after the fixed
header `{"schema":1,"ts":…,"dt":…,"lay":"…",` that `sample_payload` writes first; if that header
ever changes, each node re-encodes the board's decoded payload instead (~30 µs), which stays
correct and is logged once.

Alerts: each board's `nvmon.audit` findings (warning and critical) that persist for
`ALERT_HOLD` ticks become the board's alert set, shared by its nodes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import tempfile
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from nvmon.audit import audit
from nvmon.collect.node import NodeSampler
from nvmon.model import Sample
from nvmon.sim.node import SimNode
from nvmon.specs import NodeSpec
from nvmon.wire.contract import Alert
from nvmon.wire.payloads import alerts_payload, encode, inventory_payload, layout_id, sample_payload

log = logging.getLogger("nvmon.loadgen")

ALERT_HOLD = 3  # ticks a finding must persist (or stay gone) before its alert fires (or clears)
_HEAD = re.compile(rb'\{"schema":1,"ts":[-+0-9.eE]+,"dt":([-+0-9.eE]+|null),"lay":"[0-9a-f]{1,16}",')
_NS = uuid.UUID("6d1f8e3a-6a0e-4a43-9a53-3f1f6a4e0b51")  # namespace of the simulated GPUs' UUIDs


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """What makes a simulated node itself: its name, rack, labels and GPU identities."""

    cluster: str
    name: str
    rack: str
    labels: dict[str, str]


def node_sample(sample: Sample, who: NodeIdentity) -> Sample:
    """The board's sample as node `who` would report it: its own name, host name, GPU UUIDs and
    serials (stable per node), so inventories differ as a real fleet's do."""
    def serial(i: int) -> str:
        return str(int(hashlib.blake2s(f"{who.cluster}/{who.name}/{i}".encode(), digest_size=6).hexdigest(), 16))[:13]

    gpus = tuple(replace(g, uuid=f"GPU-{uuid.uuid5(_NS, f'{who.cluster}/{who.name}/{g.index}')}",
                         serial=serial(g.index)) for g in sample.gpus)
    return replace(sample, node=who.name, gpus=gpus, host=replace(sample.host, hostname=who.name))


class Board:
    """One simulated board: `tick()` samples it (blocking, ~12 ms: run it off the event loop)
    and refreshes what its nodes publish. `layout_gen` / `alerts_gen` change when nodes must
    re-send their inventory / alert set."""

    def __init__(self, spec: str, *, interval_s: float, clock_start: float, node_spec: NodeSpec = NodeSpec(),
                 workdir: Path | None = None):
        self.spec, self.interval_s, self.node_spec = spec, interval_s, node_spec
        self._now = clock_start - interval_s
        # The fake /sys tree: SimNode's own temp dir (tmpfs) unless `workdir` is given, so that a
        # caller who may kill the process (tests) can have it removed with that directory.
        self._root = None if workdir is None else Path(tempfile.mkdtemp(prefix="board-", dir=workdir))
        self.sim = SimNode(spec, clock=lambda: self._now, node="board", root=self._root)
        self.sampler = NodeSampler(self.sim.nvml, sysfs_root=self.sim.sysfs_root, node="board",
                                   before_tick=self.sim.sync, clock=lambda: self._now)
        self.sampler.open()
        self.sampler.sample()  # rates need a previous reading
        self.sample: Sample | None = None
        self.layout: str | None = None
        self.layout_gen = self.alerts_gen = 0
        self.alerts: bytes | None = None
        # (dt, payload after the patched header, decoded payload when the header is not recognised):
        # one tuple, swapped whole, because nodes read it while `tick` runs in a thread.
        self._parts: tuple[bytes, bytes | None, dict | None] = (b"null", None, {})
        self._seen: dict[str, list] = {}  # fingerprint → [Alert, ticks present, ticks absent, firing?]
        self._warned = False
        self.tick(clock_start)

    def tick(self, now: float) -> None:
        """Sample at `now` and prepare the payload parts; alerts move on one tick."""
        self._now = now
        sample = self.sampler.sample()
        findings = audit(sample, self.node_spec).findings  # once: the payload carries them, the alerts follow them
        payload = sample_payload(sample, findings)
        m = _HEAD.match(payload)
        if m:
            parts = (m.group(1), payload[m.end():], None)
        else:
            if not self._warned:
                log.warning("sim-fleet: sample payload header not recognised; re-encoding per node (slower)")
                self._warned = True
            parts = (b"null", None, json.loads(payload))
        # Order matters for readers on the event loop: the sample before the generation that
        # tells nodes to rebuild their inventory from it.
        self.sample, self._parts = sample, parts
        lay = layout_id(sample)
        if lay != self.layout:
            self.layout, self.layout_gen = lay, self.layout_gen + 1
        self._track_alerts(findings, now)

    def payload_for(self, layout: str, ts: float) -> bytes:
        """This tick's `sample` payload for a node with `layout`, stamped `ts`."""
        dt, rest, decoded = self._parts
        if rest is not None:
            return b'{"schema":1,"ts":%s,"dt":%s,"lay":"%s",%s' % (json.dumps(round(ts, 3)).encode(), dt,
                                                                   layout.encode(), rest)
        d = dict(decoded or {})
        d["ts"], d["lay"] = round(ts, 3), layout
        return encode(d)

    def inventory_for(self, who: NodeIdentity) -> tuple[bytes, str]:
        """(inventory payload, layout id) of node `who` on this board's current layout."""
        s = node_sample(self.sample, who)
        return (inventory_payload(s, cluster=who.cluster, rack=who.rack, labels=who.labels, spec=self.node_spec),
                layout_id(s))

    def _track_alerts(self, findings, now: float) -> None:
        present = {}
        for f in findings:
            if f.severity == "info":
                continue
            fp = hashlib.blake2s(repr((f.code, f.gpu, f.link, f.device, f.port)).encode(), digest_size=4).hexdigest()
            present[fp] = f
        changed = False
        for fp, f in present.items():
            st = self._seen.setdefault(fp, [None, 0, 0, False])
            st[1], st[2] = st[1] + 1, 0
            if not st[3] and st[1] >= ALERT_HOLD:
                st[0] = Alert(fingerprint=fp, code=f.code, severity=f.severity, state="firing",
                              summary=f.message[:512], since=now, gpu=f.gpu, link=f.link, device=f.device, port=f.port)
                st[3] = changed = True
        for fp in [fp for fp in self._seen if fp not in present]:
            st = self._seen[fp]
            st[1], st[2] = 0, st[2] + 1
            if st[2] >= ALERT_HOLD or not st[3]:
                changed |= st[3]
                del self._seen[fp]
        if changed or self.alerts is None:
            self.alerts = alerts_payload([st[0] for st in self._seen.values() if st[3]], now)
            self.alerts_gen += 1

    def close(self) -> None:
        self.sampler.close()
        self.sim.close()
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
