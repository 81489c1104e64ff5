"""CPU per fleet-row summary (`nvmon.fleet.summary.summarize`): the TUI and `nvmon fleet` run it
for every sample they apply. Usage: `.venv/bin/python bench/summary_cost.py REPO_ROOT` (a tree to
measure, e.g. one exported with `git archive`, with PYTHONPATH set to it); prints the best of 5 ×
20,000 calls on a healthy and a faulty simulated HGX H100 tick."""

import sys, timeit, dataclasses
sys.path.insert(0, sys.argv[1] + "/tests")
from test_wire_payloads import sim_ticks
from nvmon.wire.payloads import sample_payload, inventory_payload, parse_message
from nvmon.fleet.summary import Facts, summarize
from nvmon.wire.contract import topic
try:
    from nvmon.audit import audit
    has_f = "findings" in sample_payload.__code__.co_varnames
except Exception:
    has_f = False
out = []
for spec in ("hgx-h100", "hgx-h100,pcie_width=3:8,nvlink_down=2.5,power_cap=4"):
    s = sim_ticks(spec, 3)[-1]
    pl = sample_payload(s, audit(s).findings) if has_f else sample_payload(s)
    tick = parse_message(topic("c", "gpu-node-01", "sample"), pl)
    inv = parse_message(topic("c", "gpu-node-01", "inventory"), inventory_payload(s, cluster="c"))
    facts = Facts.of(inv)
    n = 20000
    t = min(timeit.repeat(lambda: summarize(tick, facts), number=n, repeat=5)) / n
    out.append(f"{spec}: {t*1e6:.1f} us")
print(sys.argv[1], "; ".join(out))
