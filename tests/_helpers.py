"""Shared save/restore check for every stateful sampler."""

from collections.abc import Callable
from typing import Any


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


def compile_with_limit(fn: Any, limit: int, **kwargs: Any) -> Any:
    """``torch.compile(fn, recompile_limit=limit, **kwargs)``; torch < 2.13 has no such
    argument (only dynamo's global config), so a test that needs it is skipped there."""
    import pytest
    import torch

    from shapebucket._torch_version import has

    if not has("compile_recompile_limit"):
        pytest.skip(f"torch {torch.__version__}: torch.compile takes no recompile_limit")
    return torch.compile(fn, recompile_limit=limit, **kwargs)
