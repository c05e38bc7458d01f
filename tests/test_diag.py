"""`gpuwatch diag` (docs/diag.md) on the simulated node, as real processes: the command and its children (torch's CPU
device for the memory patterns and the matmul loop, the simulated GPU's link and physics for the bandwidth and the
readings), the deadline that kills a hung child, the busy rule, and the agent that exports the results, judges a
failure and holds it in the fault ledger until `gpuwatch repair`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
from ports import free_port
from processes import stop, until, wait_until_ready
from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.cli.probe_command import polled_node
from gpuwatch.collectors.configuration import load_config
from gpuwatch.probe.diag import DiagRunner, LevelPlan
from gpuwatch.probe.diag_launch import DiagLauncher
from gpuwatch.probe.diag_node import judge_allreduce
from gpuwatch.probe.diag_results import read_results
from gpuwatch.probe.launch import worker_argv

pytest.importorskip("torch")  # the simulated child runs its memory test and matmul loop on torch's CPU device

LEVEL_1_BUDGET_S = 30.0


def diag(
    state: Path, *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> tuple[int, dict[str, Any] | None, str, float]:
    """`gpuwatch diag --backend simulated --json …`: exit status, its JSON (None when it printed none), stderr, wall."""
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuwatch",
            "diag",
            "--backend",
            "simulated",
            "--json",
            "--state-dir",
            str(state),
            *args,
        ],
        capture_output=True,
        timeout=timeout,
        check=False,
        env=env,
    )
    wall = time.monotonic() - started
    out = done.stdout.decode()
    return done.returncode, (json.loads(out) if out.strip() else None), done.stderr.decode(), wall


def tool_on_path(tmp_path: Path, name: str, script: str) -> dict[str, str]:
    """An environment whose PATH finds `name` first: a shell script standing in for a vendor's tool."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(script)
    (bin_dir / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def results(doc: dict[str, Any]) -> dict[int, dict[str, tuple[str, str]]]:
    return {g["index"]: {t["name"]: (t["result"], t["detail"]) for t in g["tests"]} for g in doc["gpus"]}


def test_level_1_on_a_healthy_node_passes_every_gpu_test_within_the_deadline(tmp_path: Path) -> None:
    code, doc, err, wall = diag(tmp_path, "--level", "1", "--gpus", "2")
    assert code == 0, err
    assert doc is not None and [g["index"] for g in doc["gpus"]] == [0, 1]
    for gpu in doc["gpus"]:
        assert gpu["uuid"].startswith("GPU-")
        by_name = {t["name"]: t for t in gpu["tests"]}
        for name in ("hbm", "pcie", "sustained"):  # at least three tests, each ran and passed
            assert by_name[name]["result"] == "pass", by_name[name]
        assert "no mismatch" in by_name["hbm"]["detail"]
        assert "of 63.0 GB/s nominal (gen 5 x16)" in by_name["pcie"]["detail"]
        assert "power mean" in by_name["sustained"]["detail"]  # the vendor library's readings during the run
        # No NCCL in a CPU build, no dcgmi here: skipped, saying why, never passed.
        assert by_name["allreduce"]["result"] == "skip" and "NCCL" in by_name["allreduce"]["detail"]
        assert by_name["p2p"] == {**by_name["p2p"], "result": "skip", "detail": "torch's CPU device has no peer link"}
        assert by_name["dcgm"]["result"] == "skip" and "dcgmi" in by_name["dcgm"]["detail"]
        assert sum(t["seconds"] for t in gpu["tests"]) <= LEVEL_1_BUDGET_S
    assert wall < LEVEL_1_BUDGET_S + 30  # the GPUs run at once: the node's start-up and reading it on top
    written = read_results(tmp_path)
    assert {r.index for r in written.values()} == {0, 1}
    assert all(t.result in ("pass", "skip") and t.level == 1 for r in written.values() for t in r.tests.values())


def test_a_degraded_link_fails_the_bandwidth_test_against_its_nominal(tmp_path: Path) -> None:
    # pcie_degraded's GPU 2 is under load (a compute process), so it takes --force.
    code, doc, err, _ = diag(tmp_path, "--scenario", "pcie_degraded", "--gpus", "3", "--gpu", "2", "--force")
    assert code == 1, err
    assert doc is not None
    tests = results(doc)[2]
    result, detail = tests["pcie"]
    assert result == "fail" and "below 70% of nominal" in detail and "link now gen 3 x8" in detail
    assert tests["hbm"][0] == "pass" and tests["sustained"][0] == "pass"
    assert "testing it anyway (--force)" in err


def test_an_underperforming_gpu_fails_the_sustained_matmul_against_its_peers(tmp_path: Path) -> None:
    code, doc, err, _ = diag(tmp_path, "--scenario", "underperforming", "--gpus", "3")
    assert code == 1, err
    assert doc is not None
    by_gpu = results(doc)
    assert by_gpu[2]["sustained"][0] == "fail" and "80% of its 2 peer(s)' median" in by_gpu[2]["sustained"][1]
    assert by_gpu[0]["sustained"][0] == "pass" and by_gpu[1]["sustained"][0] == "pass"
    assert all(by_gpu[i]["hbm"][0] == "pass" and by_gpu[i]["pcie"][0] == "pass" for i in range(3))


def test_faulty_memory_fails_the_pattern_test_with_the_words_read_back_wrong(tmp_path: Path) -> None:
    code, doc, err, _ = diag(tmp_path, "--scenario", "ecc_uncorrectable", "--gpus", "3", "--gpu", "1", "--gpu", "2")
    assert code == 1, err
    assert doc is not None
    by_gpu = results(doc)
    assert by_gpu[2]["hbm"][0] == "fail" and "words read back wrong" in by_gpu[2]["hbm"][1]
    assert "walking_one_8: 1" in by_gpu[2]["hbm"][1]  # the stuck bit shows in its own walking-one pattern
    assert by_gpu[1]["hbm"][0] == "pass"


def test_a_busy_gpu_is_refused_naming_its_process_and_tested_when_forced(tmp_path: Path) -> None:
    code, doc, err, _ = diag(tmp_path, "--scenario", "busy", "--gpus", "2")
    assert code == 69 and doc is None
    # Named as the workloads collector names them: the job and its user, from the node's procfs.
    assert "GPU 0 is busy: held by PID 40000 (slurm_job 4242, user" in err and "--force" in err
    assert not (tmp_path / "diag_results.json").exists()
    code, doc, err, _ = diag(tmp_path, "--scenario", "busy", "--gpus", "2", "--gpu", "0", "--force")
    assert code == 0, err
    assert doc is not None and results(doc)[0]["hbm"][0] == "pass"


def test_bad_usage_exits_2(tmp_path: Path) -> None:
    code, _, err, _ = diag(tmp_path, "--level", "4")
    assert code == 2 and "--level" in err
    code, _, err, _ = diag(tmp_path, "--gpus", "2", "--gpu", "5")
    assert code == 2 and "no GPU [5] on this node (GPUs: [0, 1])" in err


def test_a_hung_test_is_killed_at_its_deadline_and_the_tests_left_run_in_a_new_child(tmp_path: Path) -> None:
    config = load_config(
        None, {"agent": {"backend": "simulated", "state_dir": str(tmp_path)}, "simulated": {"gpus": 1}}
    )
    hung = DiagLauncher(
        lambda _identity: [*worker_argv("gpuwatch.simulated.diag_worker"), "--hang-in", "hbm"],
        ("--device", "cpu", "--bytes", str(4 * 2**20)),
    )
    plan = LevelPlan(0.25, 1.0, {"start": 20.0, "hbm": 2.0, "pcie": 5.0, "sustained": 8.0}, 60.0)
    with polled_node(config) as (store, _sources):
        runner = DiagRunner(store, tmp_path, hung, level=1, plan=plan)
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        started = time.monotonic()
        (gpu,) = runner.run(runner.choose(set(), force=False))
        took = time.monotonic() - started
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.is_running()]
    assert not [p for p in left if p.status() != psutil.STATUS_ZOMBIE], "a diag child outlived the run"
    by_name = {t.name: t for t in gpu.tests}
    assert by_name["hbm"].result == "fail"
    assert "did not finish within its 2 s deadline: the child was killed" in by_name["hbm"].detail
    assert 2.0 <= by_name["hbm"].seconds < 4.0
    # The second child hangs in nothing else: the bandwidth and the matmul ran and passed.
    assert by_name["pcie"].result == "pass" and by_name["sustained"].result == "pass"
    assert took < 40


# `dcgmi diag -r 1 -j` as DCGM 4 prints it (NVIDIA/DCGM testing/python3/dcgm_diag_schema.json): GPU 1 fails memory.
DCGM_JSON = {
    "DCGM Diagnostic": {
        "test_categories": [
            {
                "category": "Hardware",
                "tests": [
                    {
                        "name": "memory",
                        "results": [
                            {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status": "Pass"},
                            {
                                "entity_group": "GPU",
                                "entity_group_id": 1,
                                "entity_id": 1,
                                "status": "Fail",
                                "warnings": [
                                    {
                                        "error_category": 1,
                                        "error_id": 18,
                                        "error_severity": 2,
                                        "warning": "GPU 1: memory test found 3 errors",
                                    }
                                ],
                            },
                        ],
                        "test_summary": {"status": "Fail"},
                    }
                ],
            }
        ]
    },
    "metadata": {"version": "4.2.3"},
}


def test_dcgmi_diag_is_folded_in_per_gpu_where_it_is_installed(tmp_path: Path) -> None:
    calls = tmp_path / "dcgmi-calls"
    env = tool_on_path(
        tmp_path, "dcgmi", f"#!/bin/sh\necho \"$@\" >> {calls}\ncat <<'EOF'\n{json.dumps(DCGM_JSON)}\nEOF\nexit 226\n"
    )
    code, doc, err, _ = diag(tmp_path / "state", "--gpus", "2", env=env)
    assert code == 1, err
    assert doc is not None
    by_gpu = results(doc)
    assert by_gpu[0]["dcgm"] == ("pass", "dcgmi diag -r 1: 1 test(s) passed")
    assert by_gpu[1]["dcgm"][0] == "fail" and "memory: GPU 1: memory test found 3 errors" in by_gpu[1]["dcgm"][1]
    assert calls.read_text().split() == ["diag", "-r", "1", "-j", "-i", "0,1"]


# `rvs -r 3 -j FILE`'s log as RVS builds it (ROCm/ROCmValidationSuite src/rvsliblogger.cpp: "version", then a node
# per module and a list per action; include/rvs_util.h log_to_json: gpu_id, gpu_index, the module's keys, "pass" as
# "true"/"false"; gst.so/src/gst_worker.cpp: target, dtype, gflops; mem.so/src/rvs_memworker.cpp: Test, Time Taken,
# errors). GPU 1 misses its GEMM target; GPU 0 passes; a node-level record without gpu_index belongs to no GPU.
RVS_JSON = {
    "version": "1.0",
    "gst": {
        "gst-1000Tflops-4K4K8K-rand-fp8": [
            {
                "gpu_id": "28851",
                "gpu_index": "0",
                "target": "1000000",
                "dtype": "fp8_r",
                "gflops": "1154273",
                "pass": "true",
            },
            {
                "gpu_id": "45601",
                "gpu_index": "1",
                "target": "1000000",
                "dtype": "fp8_r",
                "gflops": "611532",
                "pass": "false",
            },
        ]
    },
    "mem": {
        "mem-walking-1": [
            {
                "gpu_id": "28851",
                "gpu_index": "0",
                "Test": "Walking 1 bit",
                "Time Taken": "1.52",
                "errors": "0",
                "pass": "true",
            },
            {
                "gpu_id": "45601",
                "gpu_index": "1",
                "Test": "Walking 1 bit",
                "Time Taken": "1.49",
                "errors": "0",
                "pass": "true",
            },
        ]
    },
    "rcqt": {"metapackage-validation": [{"package": "rocm", "pass": "true"}]},
}


def test_rvs_is_folded_in_per_gpu_on_an_amd_node(tmp_path: Path) -> None:
    calls = tmp_path / "rvs-calls"
    # Writes its JSON where -j says, as rvs does, and prints only the log file's name (as with --quiet).
    env = tool_on_path(
        tmp_path,
        "rvs",
        f"#!/bin/sh\necho \"$@\" >> {calls}\nout=''\nwhile [ $# -gt 0 ]; do\n"
        '  if [ "$1" = -j ]; then out="$2"; fi\n  shift\ndone\n'
        f'cat > "$out" <<\'EOF\'\n{json.dumps(RVS_JSON)}\nEOF\necho "json log file is $out"\nexit 1\n',
    )
    code, doc, err, _ = diag(tmp_path / "state", "--vendor", "amd", "--gpus", "2", "--level", "2", env=env)
    assert code == 1, err
    assert doc is not None
    by_gpu = results(doc)
    assert by_gpu[0]["rvs"] == ("pass", "rvs -r 3: 2 action(s) passed")
    result, detail = by_gpu[1]["rvs"]
    assert result == "fail" and "gst/gst-1000Tflops-4K4K8K-rand-fp8: target=1000000" in detail
    assert "gflops=611532" in detail and "mem/" not in detail
    argv = calls.read_text().split()
    assert argv[:4] == ["-r", "3", "-i", "0,1"] and argv[4] == "-j" and argv[6] == "--quiet"


def test_rvs_without_its_json_is_a_skip_with_its_words(tmp_path: Path) -> None:
    env = tool_on_path(tmp_path, "rvs", "#!/bin/sh\necho 'Error: unknown option -r' >&2\nexit 255\n")
    _, doc, err, _ = diag(tmp_path / "state", "--vendor", "amd", "--gpus", "1", env=env)
    assert doc is not None, err
    result, detail = results(doc)[0]["rvs"]
    assert result == "skip" and detail == "rvs -r 2 wrote no JSON (exit 255): Error: unknown option -r"


def test_the_all_reduce_child_sums_right_and_is_held_to_the_gpus_links(tmp_path: Path) -> None:
    """The child as a GPU node runs it, with gloo on the CPU: real processes, one per rank."""
    done = subprocess.run(
        [*worker_argv("gpuwatch.probe.diag_allreduce"), "--world", "2", "--device", "cpu", "--mib", "4"],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    doc = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert doc["ok"] and doc["backend"] == "gloo" and doc["wrong_elements"] == 0 and doc["world"] == 2
    assert doc["busbw_bytes_per_second"] > 0
    config = load_config(
        None, {"agent": {"backend": "simulated", "state_dir": str(tmp_path)}, "simulated": {"gpus": 2}}
    )
    with polled_node(config) as (store, _sources):
        snap = store.snapshot()
        chosen = sorted(((snap.identities[u], s) for u, s in snap.samples.items()), key=lambda p: p[0].index)
    outcome = judge_allreduce(chosen, doc, 1.0)
    # A CPU's gloo all-reduce (~1 GB/s) against two simulated H100s' links: far below the floor.
    assert outcome.result == "fail" and "below 25% of the links' nominal" in outcome.detail
    assert judge_allreduce(chosen, {**doc, "wrong_elements": 7}, 1.0).detail.startswith("7 elements summed wrong")


def _metrics(base: str) -> dict[tuple[str, str, str], float]:
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {
        (s.labels["gpu"], s.labels["test"], s.labels["result"]): s.value
        for f in text_string_to_metric_families(text)
        if f.name == "gpuwatch_diag_result"
        for s in f.samples
    }


def _gpu(base: str, index: int) -> dict[str, Any]:
    request = urllib.request.Request(f"{base}/health/gpus", headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            doc = json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        doc = json.loads(exc.read())
    return next(g for g in doc["gpus"] if g["index"] == index)


def test_the_agent_exports_the_results_and_holds_a_failure_in_the_ledger_until_repaired(tmp_path: Path) -> None:
    state = tmp_path / "state"
    code, _, err, _ = diag(state, "--scenario", "underperforming", "--gpus", "3")
    assert code == 1, err
    config = tmp_path / "agent.toml"
    config.write_text("[simulated]\ngpus = 3\n")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "agent.log"
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "gpuwatch", "run", "--backend", "simulated", "--scenario", "underperforming"),
            *("--config", str(config), "--listen", f"127.0.0.1:{port}", "--state-dir", str(state)),
            *("--poll-interval", "1", "--probe-interval", "0"),  # no probe: the diag's result is the only signal
        ],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        env={**os.environ},
    )
    try:
        wait_until_ready(f"{base}/healthz", proc, "agent")
        exported = until("the diag results exported", lambda: _metrics(base).get(("2", "sustained", "fail")) == 1, 30)
        assert exported
        metrics = _metrics(base)
        assert metrics[("2", "sustained", "pass")] == 0 and metrics[("0", "sustained", "pass")] == 1
        assert metrics[("0", "allreduce", "skip")] == 1
        gpu = until("GPU 2 unhealthy", lambda: (g := _gpu(base, 2))["state"] == "unhealthy" and g, 30)
        assert gpu["action"] == "reset_gpu"
        assert any(e.startswith("GpuDiagFailed: diag sustained (level 1) failed at") for e in gpu["evidence"])
        held = until("the fault held", lambda: _gpu(base, 2)["held"], 30)
        assert [h["fault"] for h in held] == ["GpuDiagFailed"] and held[0]["action"] == "reset_gpu"
        assert _gpu(base, 0)["state"] == "healthy"
        repaired = subprocess.run(
            [sys.executable, "-m", "gpuwatch", "repair", "--gpu", "2", "--note", "reset", "--state-dir", str(state)],
            capture_output=True,
            timeout=30,
            check=False,
        )
        assert repaired.returncode == 0, repaired.stderr.decode()
        # The failure predates the repair: mended, not reopened as "returned", until a later run fails again.
        healthy = until("GPU 2 healthy after the repair", lambda: (g := _gpu(base, 2))["state"] == "healthy" and g, 30)
        assert healthy["held"] == []
    finally:
        stop(proc)
    assert "Traceback" not in log.read_text()
