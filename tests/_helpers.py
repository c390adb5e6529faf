"""Shared test helpers: the save/restore check for every stateful sampler, the torchrun
command, the bench CLI in its own interpreter, and subprocess timeouts that scale with the machine's load."""

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

import pytest

#: multiplies every subprocess timeout of the suite (a slow or shared machine: 2, 4, ...)
TIMEOUT_SCALE_ENV = "SHAPEBUCKET_TEST_TIMEOUT_SCALE"


def check_resume_at_every_position(make_sampler: Callable[[], Any], epoch: int = 0) -> None:
    """For every position k of an epoch: a fresh sampler restored from the state
    saved after k batches yields exactly the remaining batches; after the last one (the
    iterator not exhausted) the epoch is complete and the restored sampler's next pass
    is the next epoch (the uninterrupted sampler, pinned by ``set_epoch``, repeats its
    epoch as ``DistributedSampler`` does)."""
    ref = make_sampler()
    ref.set_epoch(epoch)
    full = list(ref)
    ref.set_epoch(epoch + 1)
    after = list(ref)  # the epoch after it
    for k in range(len(full) + 1):
        s = make_sampler()
        s.set_epoch(epoch)
        it = iter(s)
        head = [next(it) for _ in range(k)]
        state = s.state_dict()
        restored = make_sampler()
        restored.load_state_dict(state)
        if k == len(full) > 0:
            assert (state["epoch"], state["position"], state["num_batches"]) == (epoch, k, k)
            assert list(restored) == after, "the epoch after the end differs"
            assert list(s) == full, "set_epoch's epoch is not pinned"
        else:
            assert head + list(restored) == full, f"resume after {k} batches differs"


def torchrun(script, *args) -> list[str]:
    """The command that runs ``script`` on 2 local processes (gloo on CPU).

    ``--standalone`` lets the launcher pick a free port for its rendezvous, so
    two test runs on one machine never collide on a fixed port.
    """
    import sys

    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(script),
        *map(str, args),
    ]


def build(cls, *data, **kwargs):
    """``cls(*data, **kwargs)``, or ``cls.for_tokens(*data, **kwargs)`` when the keyword
    arguments hold a ``tokens_per_batch`` (the samplers' two ways to size batches)."""
    if "tokens_per_batch" in kwargs:
        return cls.for_tokens(*data, **kwargs)
    return cls(*data, **kwargs)


def load_per_core() -> float:
    """The 1-minute load average per CPU core (0.0 where the platform has none)."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except (AttributeError, OSError):
        return 0.0


def scaled_timeout(base_s: float) -> float:
    """``base_s``, the limit on a quiet machine, times the load per core where it is above 1
    (a loaded machine runs the subprocess proportionally slower) and times
    ``$SHAPEBUCKET_TEST_TIMEOUT_SCALE`` (1 when unset)."""
    raw = os.environ.get(TIMEOUT_SCALE_ENV, "1")
    try:
        scale = float(raw)
    except ValueError:
        scale = -1.0
    if not scale > 0:
        raise ValueError(f"{TIMEOUT_SCALE_ENV}={raw!r} is not a positive number; set it to e.g. 2")
    return base_s * scale * max(1.0, load_per_core())


def run_scaled(args: Sequence[Any], base_s: float, **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run(args, timeout=scaled_timeout(base_s), **kwargs)``; a timeout fails the
    test with the limit, the load when it started and when it stopped, and how to raise it."""
    limit = scaled_timeout(base_s)
    before = load_per_core()
    try:
        return subprocess.run(list(map(str, args)), timeout=limit, **kwargs)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"{' '.join(map(str, args))[:200]} ran past {limit:.1f} s ({base_s:.1f} s on a quiet "
            f"machine, scaled by the load); load per core {before:.2f} when it started, "
            f"{load_per_core():.2f} now on {os.cpu_count()} cores. On a loaded or slow machine "
            f"raise the limit with {TIMEOUT_SCALE_ENV}=2 (a factor on every subprocess timeout)",
            pytrace=False,
        )
def compile_with_limit(fn: Any, limit: int, **kwargs: Any) -> Any:
    """``torch.compile(fn, recompile_limit=limit, **kwargs)``; torch < 2.13 has no such
    argument (only dynamo's global config), so a test that needs it is skipped there."""
    import torch

    from shapebucket._torch.version import has

    if not has("compile_recompile_limit"):
        pytest.skip(f"torch {torch.__version__}: torch.compile takes no recompile_limit")
    return torch.compile(fn, recompile_limit=limit, **kwargs)


def bench(*args, timeout=1500):  # set for a compile-while-training run (gone), not re-measured
    """The bench CLI in its own interpreter; ``timeout`` is the limit on a quiet machine,
    scaled by the load (``tests/_helpers.py``: a timeout names the load).

    One torch thread, as tests/test_examples.py runs the examples: on 2 shared cores two
    OpenMP threads spin against each other; what the tests check does not depend on the
    thread count."""
    return run_scaled(
        [sys.executable, "-m", "shapebucket", "bench", *args],
        timeout,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
