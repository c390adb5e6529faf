import os

import pytest
from hypothesis import settings

from shapebucket import _torch as compat

settings.register_profile("ci", max_examples=100, deadline=None, print_blob=True)
settings.register_profile("dev", max_examples=50, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def fresh_compiler():
    """No compiled graphs and the default recompile limit before and after the test: compiled
    instances of one class share a code object, so they would count against one limit."""
    old = compat.get_recompile_limit()
    compat.reset_compiler()  # also forgets earlier recompile-limit hits
    yield
    compat.set_recompile_limit(old)
    compat.reset_compiler()


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """One intra-op thread in every test process, the count restored after the session. The
    suite runs on 2 xdist processes (scripts/test.sh) on this project's 2-core machine, where
    two OpenMP threads per process spin against the other process: a packed collate's
    ``repeat_interleave`` took 5 ms a call with 2 threads under load and microseconds with 1
    (one property test: 36 s, 4.6 s). What the tests check does not depend on the count, and
    the subprocess tests already run with ``OMP_NUM_THREADS=1``."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
