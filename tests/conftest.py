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
