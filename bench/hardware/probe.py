"""The kit's daemon run: the real `nvmon daemon` code with every NVML call timed, until SIGTERM.

Run by bench/hardware/kit.py as a child process (so that its CPU time and RSS are the daemon's
alone). Before the daemon starts, it asks NVML for each GPU's fabric state directly
(`nvmlDeviceGetGpuFabricInfoV` with nvml.h's own v3 / v2 struct layouts): a third opinion beside
nvmon's own reading (`nvmon sample`'s gpus[].fabric) and nvidia-smi's, named by the comparison where
it disagrees with nvmon. On exit it writes one JSON file: the NVML calls the daemon made (bench/hardware/
timed_nvml.py), the daemon's own counters, the fabric probe and any error.

    python bench/hardware/probe.py --stats OUT.json --prometheus 127.0.0.1:PORT --db DB [--sim SPEC]
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import logging
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timed_nvml import TimedNvml  # noqa: E402  (a sibling module, not a package)

FABRIC_STATES = {0: "Not Supported", 1: "Not Started", 2: "In Progress", 3: "Completed"}
HEALTH_SUMMARY = {0: None, 1: "Healthy", 2: "Unhealthy", 3: "Limited Capacity"}  # 0: not supported


# nvml.h's layouts of nvmlGpuFabricInfo_v2_t / _v3_t (the state is an unsigned char there). The C
# library writes these whatever the Python side declares, and some nvidia-ml-py releases declared
# other ones (NVML-FACTS §8), so the probe passes its own copy to the bindings' wrapper.
class FabricInfoV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_uint8 * 16), ("status", ctypes.c_uint),
                ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint8), ("healthMask", ctypes.c_uint32)]


class FabricInfoV3(ctypes.Structure):
    _fields_ = FabricInfoV2._fields_ + [("healthSummary", ctypes.c_uint8)]


VERSION_MISMATCH = 25  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH: the driver does not know that struct
LAYOUTS = ((FabricInfoV3, 3), (FabricInfoV2, 2))  # version = sizeof | n << 24 (0x3000028, 0x2000024)


def _uuid(raw) -> str:
    h = bytes(raw).hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _fabric_of(nv, handle) -> dict:
    for layout, n in LAYOUTS:
        info = layout(version=ctypes.sizeof(layout) | n << 24)
        try:
            nv.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
        except nv.NVMLError as e:
            if getattr(e, "value", None) == VERSION_MISMATCH:
                continue
            return {"error": str(e)}
        return {"struct": f"v{n}", "state": FABRIC_STATES.get(info.state, str(info.state)),
                "status": "Success" if info.status == 0 else str(nv.NVMLError(info.status)),
                "clique_id": info.cliqueId, "cluster_uuid": _uuid(info.clusterUuid), "health_mask": info.healthMask,
                "health_summary": HEALTH_SUMMARY.get(getattr(info, "healthSummary", 0))}
    return {"error": "the driver takes neither the v3 nor the v2 structure"}


def fabric_probe(nv) -> list[dict] | dict:
    """Each GPU's fabric state as NVML gives it ([{"index", "state", "status", ...} or
    {"index", "error"}]), or {"error": ...} when NVML cannot be used at all."""
    if nv is None:
        return {"error": "nvidia-ml-py not installed"}
    if not hasattr(nv, "nvmlDeviceGetGpuFabricInfoV"):
        return {"error": "this nvidia-ml-py has no nvmlDeviceGetGpuFabricInfoV"}
    try:
        nv.nvmlInit()
    except nv.NVMLError as e:
        return {"error": f"nvmlInit: {e}"}
    out = []
    try:
        for i in range(nv.nvmlDeviceGetCount()):
            try:
                out.append({"index": i, **_fabric_of(nv, nv.nvmlDeviceGetHandleByIndex(i))})
            except nv.NVMLError as e:
                out.append({"index": i, "error": str(e)})
    finally:
        nv.nvmlShutdown()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stats", type=Path, required=True)
    ap.add_argument("--prometheus", required=True, metavar="HOST:PORT")
    ap.add_argument("--db", required=True)
    ap.add_argument("--sim", help="a --sim spec: the simulator in place of NVML and /sys")
    ap.add_argument("--node", default="kit")
    a = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="probe %(levelname)s %(name)s: %(message)s")

    from nvmon.collect.node import NodeSampler, load_real_pynvml
    from nvmon.daemon.config import load_config
    from nvmon.daemon.main import Daemon

    result: dict = {"started": time.time(), "sim": a.sim}
    timed: dict[str, TimedNvml] = {}

    class TimedDaemon(Daemon):
        """The daemon, its sampler built on the timed module (the same steps as Daemon's own)."""

        def _make_sampler(self) -> NodeSampler:
            s = self.cfg.sampling
            if s.sim:
                from nvmon.sim.node import SimNode

                self.sim_node = SimNode(s.sim, node=self.node)
                nv, root, before = self.sim_node.nvml, self.sim_node.sysfs_root, self.sim_node.sync
            else:
                nv, root, before = load_real_pynvml(), s.sysfs_root, None
            if nv is None:
                return NodeSampler(None, sysfs_root=root, node=self.node)
            t = timed["daemon"] = TimedNvml(nv)
            sampler = NodeSampler(t, sysfs_root=root, node=self.node, before_tick=before)
            open_ = sampler.open

            def opening():  # the one-time reads at open are filed apart from the ticks' calls
                t.phase = "open"
                try:
                    return open_()
                finally:
                    t.phase = "tick"

            sampler.open = opening
            return sampler

    daemon = None
    try:
        if a.sim:
            from nvmon.sim.node import SimNode

            probe_node = SimNode(a.sim, node=a.node)
            nv_probe = probe_node.nvml
        else:
            probe_node, nv_probe = None, load_real_pynvml()
        timed["probe"] = TimedNvml(nv_probe) if nv_probe is not None else None
        result["fabric"] = fabric_probe(timed["probe"])
        if probe_node is not None:
            probe_node.close()
        with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
            f.write("# the kit's daemon: defaults only (never a node's /etc/nvmon/nvmon.toml)\n")
        cfg = load_config(Path(f.name), {"broker": "", "db": a.db, "interval": 1.0, "prometheus": a.prometheus,
                                         "sim": a.sim, "node": a.node})
        daemon = TimedDaemon(cfg)
        result["exit_status"] = asyncio.run(daemon.run())
    except BaseException as e:  # the kit reports it; the stats file must still be written
        result["error"] = f"{type(e).__name__}: {e}"
        result["traceback"] = traceback.format_exc(limit=8)
    finally:
        ticks = daemon.stats.ticks if daemon is not None else 0
        result["stopped"] = time.time()
        if daemon is not None:
            st = daemon.stats
            result["daemon"] = {"ticks": st.ticks, "missed_ticks": st.missed_ticks,
                                "sample_errors": st.sample_errors,
                                "sample_ms_mean": round(st.sample_seconds_total / st.ticks * 1e3, 3) if st.ticks else None}
        # The third-party modules the daemon loaded: the kit's test holds requirements.txt to them.
        result["modules"] = sorted({m.split(".")[0] for m in sys.modules} - set(sys.stdlib_module_names)
                                   - {"nvmon", "__main__", "timed_nvml", "probe"})
        result["nvml_calls"] = timed["daemon"].stats(ticks) if "daemon" in timed else {}
        result["probe_calls"] = timed["probe"].stats() if timed.get("probe") is not None else {}
        a.stats.write_text(json.dumps(result, indent=1))
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
