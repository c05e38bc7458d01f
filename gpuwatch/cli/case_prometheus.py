"""What Prometheus remembers about one GPU, for `gpuwatch report`: its probe history beside its fleet peers of the
same model, its XIDs, and temperature, power and clocks around each fault.

The agent keeps only the present; Prometheus keeps the history. The queries are the recording rules the dashboards
and alerts use (deploy/prometheus/gpuwatch-rules.yml: `gpuwatch:probe_flops:fresh`, `…:fleet_median`,
`…:ratio_to_fleet_median`), so the case file says what the on-call person saw. Plain HTTP GETs of the query API
(`/api/v1/query`, `/api/v1/query_range`) with the standard library; any failure is a `PrometheusError` naming the
URL and what went wrong, which the report prints in the section it would have filled.
"""

from __future__ import annotations

import json
import logging
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

TIMEOUT_SECONDS = 15.0
MAX_POINTS = 300  # per series: a plot, not an export
# The windows the probe history may take, shortest first: the shortest that holds all of the GPU's data (up to a
# week), so a GPU seen for ten minutes gets ten minutes at a fine step and one seen all week gets the week.
HISTORY_WINDOWS_SECONDS = (600, 3600, 6 * 3600, 86400, 7 * 86400)
BEFORE_FAULT_SECONDS = 600  # around a fault: ten minutes before it
AFTER_FAULT_SECONDS = 300  # and five after
XID_LOOKBACK = "30d"


class PrometheusError(Exception):
    """Prometheus could not answer: unreachable, an HTTP error, or a reply that is not the query API's."""


def url_problem(url: str) -> str | None:
    """Why `url` cannot be a Prometheus base URL, or None."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return f"--prometheus {url!r}: give Prometheus' base URL, http(s)://HOST:PORT (as in its web UI)"
    if parsed.query or parsed.fragment:
        return f"--prometheus {url!r}: no query or fragment; its base URL only"
    return None


@dataclass(frozen=True, slots=True)
class Prometheus:
    """One Prometheus' query API."""

    url: str

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        return self._get("/api/v1/query", params)

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        return self._get("/api/v1/query_range", params)

    def _get(self, path: str, params: dict[str, str]) -> list[dict[str, Any]]:
        url = self.url.rstrip("/") + path + "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as reply:
                document = json.loads(reply.read(16 * 2**20))
        except urllib.error.HTTPError as exc:
            detail = _error_of(exc)
            raise PrometheusError(f"{self.url} answered HTTP {exc.code} to {params['query']!r}{detail}") from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: {reason}") from exc
        except ValueError as exc:
            raise PrometheusError(f"{self.url} did not answer with the query API's JSON: {exc}") from exc
        if not isinstance(document, dict) or document.get("status") != "success":
            raise PrometheusError(f"{self.url} refused {params['query']!r}: {str(document)[:200]}")
        result = document.get("data", {}).get("result")
        if not isinstance(result, list):
            raise PrometheusError(f"{self.url} gave no result list for {params['query']!r}")
        return result


def _error_of(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read(65536))
    except (ValueError, OSError):
        return ""
    return f": {body.get('error', '')}" if isinstance(body, dict) else ""


def _selector(**labels: str) -> str:
    return "{" + ", ".join(f"{k}={json.dumps(v)}" for k, v in labels.items()) + "}"


def _points(result: list[dict[str, Any]]) -> list[list[float]]:
    """One series' [[unix time, value], …] (the first series: the queries select one GPU); NaN and Inf dropped."""
    values = result[0].get("values", []) if result else []
    points = [[float(t), float(v)] for t, v in values]
    return [p for p in points if math.isfinite(p[1])]


def _scalar(result: list[dict[str, Any]]) -> float | None:
    if not result:
        return None
    value = float(result[0]["value"][1])
    return value if math.isfinite(value) else None


def history_window(prom: Prometheus, uuid: str, now: float) -> float:
    """The shortest of HISTORY_WINDOWS_SECONDS that holds every sample of the GPU Prometheus has in the longest."""
    gpu = _selector(uuid=uuid)
    counts = []
    for seconds in HISTORY_WINDOWS_SECONDS:
        counts.append(_scalar(prom.query(f"sum(count_over_time(gpuwatch_gpu_info{gpu}[{seconds}s]))", now)) or 0.0)
        if len(counts) > 1 and counts[-1] == counts[-2]:
            return float(HISTORY_WINDOWS_SECONDS[len(counts) - 2])
    return float(HISTORY_WINDOWS_SECONDS[-1])


def _step(seconds: float) -> float:
    return max(1.0, math.ceil(seconds / MAX_POINTS))


def _data_start(prom: Prometheus, uuid: str, start: float, end: float) -> float:
    """Where the GPU's data begins within [start, end] (an agent started since): the plot starts there, not in an
    empty stretch before it."""
    step = _step(end - start)
    points = _points(prom.query_range(f"max(gpuwatch_gpu_info{_selector(uuid=uuid)})", start, end, step))
    return max(start, points[0][0] - step) if points else start


def probe_history(prom: Prometheus, uuid: str, model: str, now: float) -> dict[str, Any]:
    """The GPU's fresh probe throughput, its baseline and the median of its fleet peers of the same model (the
    recording rules), over the window its data spans; with how many GPUs the fleet median stands on now."""
    window = history_window(prom, uuid, now)
    start = _data_start(prom, uuid, now - window, now)
    step = _step(now - start)
    gpu, peers = _selector(uuid=uuid), _selector(model=model)
    series = {
        "probe_flops": _points(prom.query_range(f"max(gpuwatch:probe_flops:fresh{gpu})", start, now, step)),
        "baseline_flops": _points(prom.query_range(f"max(gpuwatch_probe_baseline_flops{gpu})", start, now, step)),
        "fleet_median_flops": _points(
            prom.query_range(f"max(gpuwatch:probe_flops:fleet_median{peers})", start, now, step)
        ),
        "ratio_to_fleet_median": _points(
            prom.query_range(f"max(gpuwatch:probe_flops:ratio_to_fleet_median{gpu})", start, now, step)
        ),
    }
    peers_now = _scalar(prom.query(f"max(last_over_time(gpuwatch:probe_flops:fleet_gpus{peers}[{int(window)}s]))", now))
    return {
        "start": start,
        "end": now,
        "step_seconds": step,
        "fleet_model": model,
        "fleet_gpus": None if peers_now is None else int(peers_now),
        "series": series,
        "queries": {
            "probe_flops": f"gpuwatch:probe_flops:fresh{gpu}",
            "baseline_flops": f"gpuwatch_probe_baseline_flops{gpu}",
            "fleet_median_flops": f"gpuwatch:probe_flops:fleet_median{peers}",
            "ratio_to_fleet_median": f"gpuwatch:probe_flops:ratio_to_fleet_median{gpu}",
        },
    }


def xids(prom: Prometheus, uuid: str, now: float) -> dict[int, dict[str, float]]:
    """Per XID code: the most one agent run counted and when it last happened, over XID_LOOKBACK."""
    gpu = _selector(uuid=uuid)
    found: dict[int, dict[str, float]] = {}
    for key, metric in (
        ("count", "gpuwatch_gpu_xid_errors_total"),
        ("last", "gpuwatch_gpu_xid_last_timestamp_seconds"),
    ):
        for series in prom.query(f"max by (xid) (max_over_time({metric}{gpu}[{XID_LOOKBACK}]))", now):
            code = str(series.get("metric", {}).get("xid", ""))
            if code.isdigit():
                found.setdefault(int(code), {})[key] = float(series["value"][1])
    return found


def around(prom: Prometheus, uuid: str, at: float, now: float) -> dict[str, Any]:
    """Temperature, power and clocks from BEFORE_FAULT_SECONDS before `at` to AFTER_FAULT_SECONDS after it."""
    end = min(now, at + AFTER_FAULT_SECONDS)
    start = min(_data_start(prom, uuid, at - BEFORE_FAULT_SECONDS, end), at - 30.0)
    step = _step(end - start)
    queries = {
        "temperature_core_celsius": f"max(gpuwatch_gpu_temperature_celsius{_selector(uuid=uuid, sensor='core')})",
        "temperature_memory_celsius": f"max(gpuwatch_gpu_temperature_celsius{_selector(uuid=uuid, sensor='memory')})",
        "power_watts": f"max(gpuwatch_gpu_power_watts{_selector(uuid=uuid)})",
        "sm_clock_hertz": f"max(gpuwatch_gpu_clock_hertz{_selector(uuid=uuid, clock='sm')})",
        "memory_clock_hertz": f"max(gpuwatch_gpu_clock_hertz{_selector(uuid=uuid, clock='memory')})",
    }
    series = {name: _points(prom.query_range(expr, start, end, step)) for name, expr in queries.items()}
    return {"start": start, "end": end, "step_seconds": step, "series": series}
