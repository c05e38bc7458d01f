"""The real-utilization recording rules (deploy/prometheus/gpuwatch-rules.yml, group gpuwatch-utilization) under
promtool: per-GPU and fleet shares on synthetic series (deploy/prometheus/tests/gpuwatch-utilization-test.yml), and
on /metrics recorded from the real agent over the dataloader_starved scenario."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from promrules import PROM_DIR, Recorder, promtool, write_rules_without_annotations
from simnode import START_WALL, SimAgent

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: run scripts/test.sh")


def test_synthetic_utilization_rule_tests(tmp_path: Path) -> None:
    write_rules_without_annotations(tmp_path)
    shutil.copy(PROM_DIR / "tests" / "gpuwatch-utilization-test.yml", tmp_path / "test.yml")
    result = promtool("test", "rules", "test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_recorded_starved_gpu_stands_out(tmp_path: Path) -> None:
    """The agent over dataloader_starved, scraped every 5 s for 6 minutes: every GPU reads utilization 1, and the
    rules single out GPU 2, whose SMs worked ~13 % of that busy time while the training GPUs' worked ~94 %."""
    sim = SimAgent(tmp_path / "state", scenario="dataloader_starved", gpus=4)
    recorder = Recorder(START_WALL, {"instance": "n1", "job": "gpuwatch"})
    try:
        for t in range(0, 361):  # poll every simulated second, scrape every 5
            sim.clock.elapsed = float(t)
            sim.agent.poll_once()
            if t % 5 == 0:
                recorder.scrape(sim.text())
        uuid = sim.gpu(2)["uuid"]
    finally:
        sim.close()
    doc = {
        "rule_files": ["gpuwatch-rules.yml", "gpuwatch-alerts.yml"],
        "evaluation_interval": "5s",
        "tests": [
            {
                "interval": "5s",
                "input_series": recorder.input_series(),
                "promql_expr_test": [
                    {
                        "expr": "gpuwatch:gpu_utilization:ratio_avg5m < 1",
                        "eval_time": "5m50s",
                        "exp_samples": [],
                    },
                    {
                        "expr": "round(gpuwatch:gpu_sm_active_when_busy:ratio_avg5m < 0.5, 0.01)",
                        "eval_time": "5m50s",
                        "exp_samples": [
                            {"labels": f'{{instance="n1",job="gpuwatch",gpu="2",uuid="{uuid}"}}', "value": 0.13}
                        ],
                    },
                    {
                        "expr": "round(gpuwatch:fleet_sm_active:ratio_rate5m, 0.01)",
                        "eval_time": "5m50s",
                        "exp_samples": [{"labels": "{}", "value": 0.74}],
                    },
                ],
            }
        ],
    }
    write_rules_without_annotations(tmp_path)
    (tmp_path / "recorded-test.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    result = promtool("test", "rules", "recorded-test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
