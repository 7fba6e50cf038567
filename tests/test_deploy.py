"""What deploy/ ships: the rules pass promtool and their unit tests, the dashboard's queries parse and
name only metrics gpuidle emits, the unit and the DaemonSet run options the CLI has, the metric table
(docs/reference/metrics.md) lists every metric."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dashboard import DASHBOARD, all_panels, dashboard_queries, metric_names
from gpuidle.cli import build_parser
from gpuidle.model import EXPORTER_METRICS, TRACKER_METRICS

ROOT = Path(__file__).parent.parent
DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "prometheus" / "gpuidle-rules.yml"
RULE_TESTS = DEPLOY / "prometheus" / "gpuidle-rules.test.yml"
EXPORTED = {m.name for m in EXPORTER_METRICS}
TRACKED = {m.name for m in TRACKER_METRICS}
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                                    reason="promtool is not installed (apt-get install prometheus)")

def test_metric_names_reads_promql() -> None:
    assert metric_names('sum by (job, rank) (rate(a_total{job=~"x|y", le="0.5"}[5m] offset 1h)) / on (job) '
                        'group_left (Hostname) b unless c > bool 0.8 and topk(5, d:e:f)') == {"a_total", "b", "c",
                                                                                             "d:e:f"}
    assert metric_names("avg_over_time((x < bool 0.8)[1h:15s]) * 1e9 - time()") == {"x"}


def _promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, cwd=cwd, check=False)


@needs_promtool
def test_rules_pass_promtool_check() -> None:
    done = _promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 12 rules found" in done.stdout


@needs_promtool
def test_rule_unit_tests_pass() -> None:
    done = _promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_rule_unit_tests_cover_every_alert_firing_and_not() -> None:
    rules = yaml.safe_load(RULES.read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    cases = [c for t in yaml.safe_load(RULE_TESTS.read_text())["tests"] for c in t.get("alert_rule_test", [])]
    assert {c["alertname"] for c in cases if c["exp_alerts"]} == alerts
    assert {c["alertname"] for c in cases if not c["exp_alerts"]} == alerts


def test_rules_name_only_exported_metrics_and_their_own_records() -> None:
    recorded: set[str] = set()
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            names = metric_names(rule["expr"])
            assert names, rule["expr"]
            assert names <= EXPORTED | recorded | {"up"}, (rule["expr"], names - EXPORTED - recorded)
            if "record" in rule:
                recorded.add(rule["record"])


@needs_promtool
def test_prometheus_example_config_is_valid() -> None:
    done = _promtool("check", "config", "prometheus.yml", cwd=DEPLOY / "prometheus")
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    queries = dashboard_queries()
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": q} for i, (_, q) in enumerate(queries)]}]}
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(rules))
    done = _promtool("check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(queries)} rules found" in done.stdout


def test_dashboard_names_only_metrics_gpuidle_emits() -> None:
    for where, query in dashboard_queries():
        names = metric_names(query)
        assert names, where
        assert names <= EXPORTED | TRACKED, (where, names - EXPORTED - TRACKED)


def test_dashboard_shows_what_the_issue_asks() -> None:
    used = set().union(*(metric_names(q) for _, q in dashboard_queries()))
    assert used >= TRACKED                          # idle causes, step time, data wait, comm, stragglers
    assert {"gpuidle_gpu_utilization_ratio", "gpuidle_gpu_memory_used_bytes", "gpuidle_gpu_memory_total_bytes",
            "gpuidle_gpu_power_watts"} <= used
    titles = " / ".join(p["title"] for p in all_panels(json.loads(DASHBOARD.read_text())["panels"]))
    for wanted in ("per GPU", "per node", "below 80 %", "below 90 %", "headroom", "Power", "by cause", "Stragglers"):
        assert wanted in titles


def _runs_the_cli(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert args.prometheus_port == 9401
    assert args.prometheus_addr == "0.0.0.0"        # a node exporter is scraped from outside
    assert args.no_summary                          # ... and keeps nothing on disk
    assert args.no_ledger


def test_systemd_unit_runs_an_exporter() -> None:
    unit = (DEPLOY / "systemd" / "gpuidle-exporter.service").read_text()
    (line,) = [x for x in unit.splitlines() if x.startswith("ExecStart=")]
    exe, *argv = shlex.split(line.removeprefix("ExecStart="))
    assert exe.endswith("/gpuidle")
    _runs_the_cli(argv)


def test_daemonset_runs_an_exporter_named_after_its_node() -> None:
    ds = yaml.safe_load((DEPLOY / "kubernetes" / "gpuidle-exporter.yaml").read_text())
    assert ds["kind"] == "DaemonSet"
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["gpuidle"]
    _runs_the_cli(c["args"])
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert c["ports"][0]["containerPort"] == 9401


def test_the_metric_table_lists_every_metric_and_no_other() -> None:
    table = (ROOT / "docs" / "reference" / "metrics.md").read_text()
    rows = re.findall(r"^ *\| `(gpuidle_\w+)` \| (gauge|counter) \| ([^|]*) \|", table, re.M)
    listed = {name: (kind, labels) for name, kind, labels in rows}
    assert set(listed) == EXPORTED | TRACKED
    for m in (*EXPORTER_METRICS, *TRACKER_METRICS):
        kind, labels = listed[m.name]
        assert kind == m.kind
        assert re.findall(r"`(\w+)`", labels) == list(m.labels), m.name
