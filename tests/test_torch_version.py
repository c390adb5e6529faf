"""The torch floor and the features that need a newer torch (issue 39: the floor at the
oldest release the package runs on, at most 2.11; a newer feature refused by name)."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest
import torch

from shapebucket import ShapeBucketError
from shapebucket._torch import version as tv
from shapebucket.compile import check_recompile_limit

ROOT = Path(__file__).resolve().parents[1]


def test_the_floor_is_at_most_2_11_and_pyproject_says_the_same():
    assert tv.MIN_TORCH <= (2, 11)
    pyproject = (ROOT / "pyproject.toml").read_text()
    floor = re.search(r'"torch>=([0-9.]+)"', pyproject)
    assert floor is not None and tv.parse_version(floor.group(1)) == tv.MIN_TORCH
    assert tv.TORCH_VERSION == tv.parse_version(torch.__version__) >= tv.MIN_TORCH


def test_an_older_torch_is_refused_at_import_naming_both_versions():
    tv.check_floor("2.11.0+cu130")
    tv.check_floor("2.15.0a0+git1234")
    with pytest.raises(ImportError, match=r"needs torch >= 2\.11, found 2\.10\.2\+cpu"):
        tv.check_floor("2.10.2+cpu")


def test_a_feature_newer_than_the_installed_torch_is_absent_until_torch_has_it(monkeypatch):
    monkeypatch.setitem(tv.FEATURES, "future", (9, 1))
    assert not tv.has("future")
    monkeypatch.setattr(tv, "TORCH_VERSION", (9, 1))
    assert tv.has("future")


@pytest.mark.parametrize(
    ("version", "fix"),
    [
        ((2, 11), "torch._dynamo.config.recompile_limit = 3"),
        ((2, 13), "torch.compile(..., recompile_limit=3)"),
    ],
)
def test_the_recompile_limit_advice_fits_the_installed_torch(monkeypatch, version, fix):
    """torch.compile takes recompile_limit= from 2.13 on: on 2.11 the advice was a
    TypeError (what the 2.11 run of the tests found)."""
    monkeypatch.setattr(tv, "TORCH_VERSION", version)
    assert tv.recompile_limit_fix(3) == fix
    with pytest.raises(ShapeBucketError, match=re.escape(fix)):
        check_recompile_limit([8, 16, 24], limit=2)


def test_the_recompile_limit_advice_runs_on_this_torch():
    """The advice for this torch, run as it reads: a function compiled that way gets the
    limit (here 2: a third shape runs eagerly)."""
    fix = tv.recompile_limit_fix(2)
    counts = []

    def backend(gm, example_inputs):
        counts.append(1)
        return gm.forward

    if fix.startswith("torch.compile"):
        f = torch.compile(lambda x: x * 2, backend=backend, dynamic=False, recompile_limit=2)
        limit = contextlib.nullcontext()
    else:
        import torch._dynamo.config as dynamo_config

        f = torch.compile(lambda x: x * 2, backend=backend, dynamic=False)
        limit = dynamo_config.patch(recompile_limit=2)
    with limit:
        for n in (2, 3, 4):
            f(torch.ones(n))
    assert len(counts) == 2
