"""Processes sharing a compile cache take turns: one builds, the others wait and load;
a builder killed mid-save leaves nothing a later run trusts, and no lock behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from shapebucket import ShapeBucketError
from shapebucket.compile import load_compile_cache
from shapebucket.compile.cache.lock import LOCKS, cache_lock

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not LOCKS, reason="no fcntl.flock on this platform")


def python(code: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_held_lock_makes_the_other_wait_and_times_out(tmp_path):
    with (
        cache_lock(tmp_path / "cache"),
        pytest.warns(UserWarning, match="waiting for"),
        pytest.raises(ShapeBucketError, match=r"cache\.lock for more than 0\.2 s"),
        cache_lock(tmp_path / "cache", timeout=0.2),
    ):
        pass
    with cache_lock(tmp_path / "cache", timeout=1.0) as waited:  # free again
        assert waited < 1.0


@pytest.mark.slow  # a fresh interpreter importing torch: 5-15 s on this loaded machine
def test_a_killed_holder_leaves_no_lock(tmp_path):
    p = python(
        f"""
        import os, signal
        from shapebucket.compile.cache.lock import cache_lock
        with cache_lock({str(tmp_path / "cache")!r}):
            print("held", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    out, _ = p.communicate(timeout=60)
    assert out.strip() == "held" and p.returncode == -signal.SIGKILL
    with cache_lock(tmp_path / "cache", timeout=2.0) as waited:
        assert waited < 2.0


@pytest.mark.slow  # a fresh interpreter importing torch: 5-15 s on this loaded machine
def test_a_save_killed_midway_is_not_trusted(tmp_path):
    """SIGKILL (no cleanup runs) while the save writes its second file: the next run finds
    no cache (the half-written temporary directory is never read), and saves one."""
    live = tmp_path / "live"
    (live / "ab").mkdir(parents=True)
    (live / "ab" / "kernel.py").write_text("x = 1\n" * 100)
    (live / "graph.bin").write_bytes(bytes(range(256)) * 8)
    p = python(
        f"""
        import os, signal
        from pathlib import Path
        from shapebucket import _torch as compat
        from shapebucket.compile import save_compile_cache
        from shapebucket.compile.cache import save as cache
        compat.save_cache_artifacts = lambda: b"artifacts" * 10
        calls = [0]
        def copy(src, dst):
            calls[0] += 1
            if calls[0] == 2:
                Path(dst).write_bytes(Path(src).read_bytes()[:10])
                os.kill(os.getpid(), signal.SIGKILL)
            Path(dst).write_bytes(Path(src).read_bytes())
        cache._copy_file = copy
        save_compile_cache({str(tmp_path / "cache")!r})
        """,
        env={"TORCHINDUCTOR_CACHE_DIR": str(live)},
    )
    p.communicate(timeout=120)
    assert p.returncode == -signal.SIGKILL
    assert not (tmp_path / "cache").exists()
    left = [d.name for d in tmp_path.iterdir() if d not in (live, tmp_path / "cache.lock")]
    assert [name.startswith(".cache.saving-") for name in left] == [True]  # the save's lock aside
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_compile_cache(tmp_path / "cache") is False  # nothing, and nothing refused


BUILD = """
import json, sys, torch
from shapebucket import prewarm
from shapebucket.compile import Cache
from shapebucket.plan import ShapePlan
torch.manual_seed(0)
# frozen weights: a forward graph alone (no backward to compile) holds the lock for seconds,
# long enough for the other process to wait on it; saving and loading a training step's
# cache in a fresh compiler is test_compile.py's test_prewarm_warm_start_from_its_cache
model = torch.compile(torch.nn.Linear(8, 8).requires_grad_(False), dynamic=False)
plan = ShapePlan.from_function([(2, 8)], lambda s: torch.randn(s.rows, s.length))
r = prewarm(model, plan, modes=[Cache(sys.argv[1])], progress=False)
print(json.dumps({"how": sorted(set(r.how.values())), "loaded": r.cache_loaded,
                  "saved": r.cache_saved, "wait": r.cache_wait_s}))
"""


@pytest.mark.slow  # an inductor compile of a tiny model in fresh processes: 10-20 s here
def test_two_processes_on_one_empty_cache_one_builds_one_loads(tmp_path):
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", BUILD, str(tmp_path / "cache")],
            cwd=ROOT,
            env={
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"live{i}"),  # each its own
                # compile in the process: no pool of compile workers, each one a fresh
                # interpreter importing torch (on 2 cores it made this process 1.7x as long)
                "TORCHINDUCTOR_COMPILE_THREADS": "1",
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = []
    for p in runs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    built = [o for o in outs if o["saved"]]
    loaded = [o for o in outs if o["loaded"]]
    assert len(built) == 1 and len(loaded) == 1, outs
    assert built[0]["how"] == ["compiled"] and not built[0]["loaded"]
    assert loaded[0]["how"] == ["cache"] and not loaded[0]["saved"]
    assert loaded[0]["wait"] > 0.05  # it waited for the builder


# -- found by the bad-input probe of the cache lock ------------------------------------------


def test_a_lock_path_that_is_a_directory_is_refused(tmp_path):
    """<key>.lock as a directory raised a raw IsADirectoryError."""
    (tmp_path / "cache.lock").mkdir()
    with (
        pytest.raises(ShapeBucketError, match=r"cache\.lock is a directory.*remove it"),
        cache_lock(tmp_path / "cache"),
    ):
        pass


def test_a_waiting_process_is_told_once_who_holds_the_lock(tmp_path):
    """A held lock was waited on in silence; the notice comes once, the timeout names the
    seconds waited."""
    with cache_lock(tmp_path / "cache"), warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with (
            pytest.raises(ShapeBucketError, match=r"cache\.lock .*waited 0\.\d s"),
            cache_lock(tmp_path / "cache", timeout=0.3),
        ):
            pass
    notices = [str(w.message) for w in said if "waiting for" in str(w.message)]
    assert len(notices) == 1, notices
    assert f"held by pid {os.getpid()}" in notices[0] and "cache.lock" in notices[0]
    assert "end that process" in notices[0]


def test_the_default_wait_is_bounded():
    import inspect

    from shapebucket.compile import Cache
    from shapebucket.compile.cache.lock import WAIT_S

    assert WAIT_S == 1800.0
    assert inspect.signature(cache_lock).parameters["timeout"].default == WAIT_S
    assert Cache("c").timeout == WAIT_S and Cache("c", timeout=None).timeout is None
    with pytest.raises(
        ShapeBucketError, match=r"Cache\(timeout\) must be a finite number > 0, got 0; pass seconds"
    ):
        Cache("c", timeout=0)


def test_the_cache_mode_gives_up_on_a_lock_held_too_long(tmp_path):
    import torch

    from shapebucket import prewarm
    from shapebucket.compile import Cache
    from shapebucket.plan import ShapePlan

    model = torch.nn.Linear(8, 8)  # not compiled: only the key and the lock matter here
    plan = ShapePlan.from_function([(2, 8)], lambda s: torch.ones(s.rows, s.length))
    path = prewarm(model, plan, modes=[Cache(tmp_path)], progress=False).cache_path
    with (
        cache_lock(path),  # another builder holds the key
        pytest.warns(UserWarning, match="waiting for"),
        pytest.raises(ShapeBucketError, match=r"\.lock .*waited 0\.\d s.*Cache\(dir, timeout="),
    ):
        prewarm(model, plan, modes=[Cache(tmp_path, timeout=0.2)], progress=False)


@pytest.mark.filterwarnings("ignore:prewarm compiled 0 graphs")
def test_a_read_only_directory_holding_the_jobs_cache_is_loaded(tmp_path, monkeypatch):
    """Issue 39 item 15: a directory this process cannot write (a shared, finished cache)
    was refused although it held a complete cache of the job. It is loaded, with no lock
    file made and nothing saved; one without that cache is still refused."""
    import torch

    from shapebucket import _torch as compat
    from shapebucket import prewarm
    from shapebucket.compile import Cache, save_compile_cache
    from shapebucket.compile.modes import cached
    from shapebucket.plan import ShapePlan

    model = torch.nn.Linear(8, 8)  # not compiled: only the key, the lock and the files matter
    plan = ShapePlan.from_function([(2, 8)], lambda s: torch.ones(s.rows, s.length))
    path = Path(prewarm(model, plan, modes=[Cache(tmp_path)], progress=False).cache_path)
    monkeypatch.setattr(compat, "save_cache_artifacts", lambda: b"artifacts" * 10)
    monkeypatch.setattr(compat, "load_cache_artifacts", lambda data: data == b"artifacts" * 10)
    live = tmp_path / "live"
    (live / "ab").mkdir(parents=True)
    (live / "ab" / "kernel.py").write_text("x = 1\n")
    with compat.fresh_inductor_cache(str(live)):
        save_compile_cache(path)
    path.with_name(path.name + ".lock").unlink()
    before = sorted(p.name for p in tmp_path.iterdir())
    monkeypatch.setattr(cached.os, "access", lambda p, mode: not mode & os.W_OK)
    with compat.fresh_inductor_cache(str(tmp_path.parent / f"{tmp_path.name}-target")):
        report = prewarm(model, plan, modes=[Cache(tmp_path)], progress=False)
    assert report.cache_loaded is True and not report.cache_saved
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no lock file, no save
    (path / "manifest.json").unlink()
    with pytest.raises(ShapeBucketError, match=r"is not writable and holds no complete cache"):
        prewarm(model, plan, modes=[Cache(tmp_path)], progress=False)
