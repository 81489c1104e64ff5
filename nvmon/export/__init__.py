"""Exports of nvmon's samples to other monitoring systems.

`prometheus` serves the daemon's latest `Sample` as a Prometheus `/metrics` endpoint whose
GPU metrics carry dcgm-exporter's names, types and labels (so existing dashboards and alert
rules keep working) beside nvmon-only `nvmon_*` metrics; `catalog` is the one declarative
list of those metrics, which the collector, the docs and the tests share; `server` is the
small HTTP server that hands out the cached exposition.

Like the rest of the core package, nothing here imports `nvmon.daemon`: the daemon feeds the
exporter samples and a health snapshot, never the other way round.
"""
