"""Alert rules, lifecycle, persistence and on-call hooks (issue 4). See docs/alerts.md."""
