"""The suite's own helpers: subprocess timeouts scale with load and say so when they hit."""

import sys

import _helpers
import pytest
from _helpers import TIMEOUT_SCALE_ENV, run_scaled, scaled_timeout


def test_a_timeout_grows_with_the_load_per_core_and_the_env_factor(monkeypatch):
    monkeypatch.delenv(TIMEOUT_SCALE_ENV, raising=False)
    monkeypatch.setattr(_helpers.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(_helpers.os, "getloadavg", lambda: (1.0, 1.0, 1.0))
    assert scaled_timeout(600) == 600  # below 1 per core: the quiet machine's limit
    monkeypatch.setattr(_helpers.os, "getloadavg", lambda: (7.0, 5.0, 3.0))
    assert scaled_timeout(600) == 600 * 3.5  # 5 helpers' worth of load on 2 cores
    monkeypatch.setenv(TIMEOUT_SCALE_ENV, "2")
    assert scaled_timeout(600) == 600 * 3.5 * 2
    for bad in ("0", "-1", "two", "nan"):
        monkeypatch.setenv(TIMEOUT_SCALE_ENV, bad)
        with pytest.raises(ValueError, match=f"{TIMEOUT_SCALE_ENV}='{bad}' is not a positive"):
            scaled_timeout(600)


def test_a_timeout_names_the_load_the_limit_and_how_to_raise_it(monkeypatch):
    monkeypatch.delenv(TIMEOUT_SCALE_ENV, raising=False)
    monkeypatch.setattr(_helpers.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    with pytest.raises(pytest.fail.Exception) as failed:
        run_scaled([sys.executable, "-c", "import time; time.sleep(30)"], 0.5)
    text = str(failed.value)
    assert "ran past 0.5 s (0.5 s on a quiet machine, scaled by the load)" in text
    assert "load per core 0.00 when it started, 0.00 now" in text
    assert f"{TIMEOUT_SCALE_ENV}=2" in text
    done = run_scaled([sys.executable, "-c", "print(7)"], 60, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "7\n"
