"""`gpuwatch run --backend nvml` as it runs on a customer's node: the installed nvidia-ml-py imported by the
production code path (backends/nvml.py load_pynvml), with only libnvidia-ml.so.1 underneath replaced by the
simulated one — pynvml keeps whatever library is in ``pynvml.nvmlLib`` (pynvml.py _LoadNvmlLibrary: "if nvmlLib
== None: ... CDLL('libnvidia-ml.so.1')").

This is how the fault of issue 13 was found: over the real binding the agent served no NVIDIA GPU at all
(TypeError: unhashable type from the event set, a traceback on every poll, no gpuwatch_backend_up series).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

from ports import free_port
from prometheus_client.parser import text_string_to_metric_families

LAUNCHER = textwrap.dedent(
    """
    import sys
    import pynvml
    from gpuwatch.simulated.libnvml import SimulatedLibNvml
    from gpuwatch.simulated.scenarios import SimulatedNode
    pynvml.nvmlLib = SimulatedLibNvml(SimulatedNode("xid", gpus=2))  # an H100 pair offering XID events
    from gpuwatch.cli.main import main
    sys.exit(main(sys.argv[1:]))
    """
)


def _scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_run_with_the_nvml_backend_serves_gpus_and_their_xids(tmp_path: Path) -> None:
    port = free_port()
    args = ["run", "--backend", "nvml", "--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "state")]
    args += ["--probe-interval", "0", "--poll-interval", "0.5", "--disable-collector", "ipmi"]
    child = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 30
        samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        while time.monotonic() < deadline:
            time.sleep(0.5)
            try:
                samples = _scrape(port)
            except OSError:
                continue
            if any(name == "gpuwatch_gpu_xid_errors_total" for name, _ in samples):
                break
        assert samples.get(("gpuwatch_backend_up", frozenset({("backend", "nvml")}))) == 1.0
        assert samples.get(("gpuwatch_gpus_detected", frozenset())) == 2.0
        xids = {dict(labels)["xid"] for name, labels in samples if name == "gpuwatch_gpu_xid_errors_total"}
        assert xids & {"13", "79"}, "no XID arrived through nvmlEventSetWait_v2"
    finally:
        child.terminate()
        output, _ = child.communicate(timeout=15)
    assert "Traceback" not in output, output
