"""In CI (`CI=true` in the environment, as GitHub Actions and .ci/run's callers set it) a test
skipped because a tool it needs is not installed (mosquitto, openssl, tmux, systemd-analyze,
prometheus, promtool, prometheus-alertmanager: every such skip says "not installed") is reported
as a failure instead: .ci/run installs them all, so a missing one is a broken CI, not a pass.
Elsewhere those tests are skipped as before, with the reason."""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2])
        if "not installed" in reason:
            report.outcome = "failed"
            report.longrepr = f"CI=true, and a tool this test needs is missing ({reason}): .ci/run installs it"
