"""Wrong passwords must not burn the CPU or lock out the real scraper: bcrypt checks run one at a time, failures are
limited per address (429), only credentials that passed are cached, and an absurd bcrypt cost is a config error."""

from __future__ import annotations

import base64
import threading
import time
from pathlib import Path

import bcrypt
import pytest

from gpuwatch.config.settings import ConfigError
from gpuwatch.web import webconfig
from gpuwatch.web.authlimit import BURST, FailureLimiter
from gpuwatch.web.webconfig import BasicAuth, load_web_config

GOOD = bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=4))


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_bcrypt_checks_run_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """32 attackers in parallel took 166 % CPU: each wrong password was its own bcrypt check, all at once."""
    auth = BasicAuth({"prometheus": GOOD})
    running, most = 0, 0
    lock = threading.Lock()
    real = bcrypt.checkpw

    def checkpw(password: bytes, hashed: bytes) -> bool:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.01)
        with lock:
            running -= 1
        return real(password, hashed)

    monkeypatch.setattr(webconfig.bcrypt, "checkpw", checkpw)
    threads = [threading.Thread(target=auth.check, args=(basic("prometheus", f"wrong{n}"),)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most == 1


def test_failed_credentials_never_evict_the_good_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache was cleared at 1,024 entries, so an attacker's wrong passwords evicted the real scraper's."""
    auth = BasicAuth({"prometheus": GOOD})
    assert auth.check(basic("prometheus", "right"))
    calls = 0
    real = bcrypt.checkpw

    def counting(password: bytes, hashed: bytes) -> bool:
        nonlocal calls
        calls += 1
        return False if password != b"right" else real(password, hashed)

    monkeypatch.setattr(webconfig.bcrypt, "checkpw", counting)
    for n in range(5000):
        assert not auth.check(basic("prometheus", f"wrong{n}"))
    calls = 0
    assert auth.cached(basic("prometheus", "right")) and auth.check(basic("prometheus", "right"))
    assert calls == 0  # still cached: no bcrypt for the real scraper


def test_failures_are_limited_per_address_with_429() -> None:
    now = [0.0]
    limiter = FailureLimiter(clock=lambda: now[0])
    for _ in range(BURST):
        assert limiter.allowed("10.0.0.1")
        limiter.failed("10.0.0.1")
    assert not limiter.allowed("10.0.0.1")
    assert limiter.allowed("10.0.0.2")  # another address has its own budget
    now[0] += 1.0
    assert limiter.allowed("10.0.0.1")  # one more try a second


def test_over_http_an_address_out_of_budget_gets_429_and_a_cached_scraper_still_200(tmp_path: Path) -> None:
    from test_webconfig import Served

    config = tmp_path / "web.yml"
    config.write_text(f"basic_auth_users:\n  prometheus: {GOOD.decode()}\n")
    server = Served(config)
    try:
        assert server.get(auth=("prometheus", "right"))[0] == 200
        statuses = [server.get(auth=("prometheus", f"wrong{n}"))[0] for n in range(BURST + 5)]
        assert statuses[:BURST] == [401] * BURST and set(statuses[BURST:]) == {429}
        assert server.get(auth=("prometheus", "right"))[0] == 200  # same address, known-good credentials
    finally:
        server.server.stop()


@pytest.mark.parametrize("cost", ["31", "15", "03"])
def test_a_bcrypt_cost_that_would_hang_check_is_a_config_error(tmp_path: Path, cost: str) -> None:
    """Cost 31 is ~28 hours per check: loading the file (agent start, `gpuwatch check`) would never finish."""
    hashed = f"$2b${cost}$" + "a" * 53
    config = tmp_path / "web.yml"
    config.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    started = time.monotonic()
    with pytest.raises(ConfigError, match="bcrypt cost"):
        load_web_config(config)
    assert time.monotonic() - started < 1.0
