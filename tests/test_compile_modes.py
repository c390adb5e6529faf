"""Each prewarm mode alone, what prewarm restores (issue 22 item 11), and that importing
shapebucket installs nothing into torch."""

from __future__ import annotations

import pytest
import torch
from _helpers import compile_with_limit
from torch import nn

from shapebucket import ShapeBucketError
from shapebucket import _torch as compat
from shapebucket.compile import (
    AotCache,
    Cache,
    CompileCounter,
    CudaGraphs,
    Inference,
    RecompileLimit,
    Repeat,
    no_recompiles,
    prewarm,
)
from shapebucket.compile.modes.base import Job
from shapebucket.compile.report import PrewarmReport
from shapebucket.plan.shapes import ShapePlan

EAGER = {"backend": "eager", "dynamic": False}


pytestmark = pytest.mark.usefixtures("fresh_compiler")


def job_of(plan, example=None, model=None, step=None, modes=()):
    return Job(model, step, plan, example, PrewarmReport(plan.shapes), tuple(modes))


# -- the other modes -------------------------------------------------------------------


def test_inference_runs_forward_only_in_inference_mode():
    with Inference().context():
        assert torch.is_inference_mode_enabled()
    model = nn.Linear(4, 1)
    plan = ShapePlan.from_function([(2, 4), (3, 4)], lambda s: torch.ones(s.rows, s.length))
    seen = []

    def step(x):
        seen.append(torch.is_inference_mode_enabled())
        model(x).sum()

    prewarm(model, plan, step=step, modes=[Inference()], progress=False)
    # settle, two shapes, verify: all in inference mode
    assert seen == [True] * 5 and model.weight.grad is None


def test_repeat_and_cuda_graphs_set_the_runs():
    assert Repeat(2).runs == 2 and CudaGraphs().runs == 3 and CudaGraphs(repeat=5).runs == 5
    with pytest.raises(ShapeBucketError, match="Repeat\\(n\\) must be >= 1, got 0"):
        Repeat(0)
    plan = ShapePlan.from_function([(1, 4)], torch.ones)
    with pytest.raises(ShapeBucketError, match="one of Repeat, CudaGraphs"):
        prewarm(None, plan, step=print, modes=[Repeat(2), CudaGraphs()])


def test_recompile_limit_alone():
    compat.set_recompile_limit(2)
    plan = ShapePlan.from_function([(1, n) for n in (4, 6, 8)], torch.ones)
    job = job_of(plan)
    with RecompileLimit().scope(job):
        assert job.report.limit_raised_from == 2 and job.report.limit == 3
        assert compat.get_recompile_limit() == 3
        with RecompileLimit(raise_limit=False).scope(job_of(plan)):  # 3 <= the raised limit
            pass
    assert compat.get_recompile_limit() == 2  # put back
    refused = pytest.raises(
        ShapeBucketError, match="3 shapes exceed the compiler's recompile limit"
    )
    with refused, RecompileLimit(raise_limit=False).scope(job_of(plan)):
        pass
    with pytest.raises(KeyError), RecompileLimit().scope(job_of(plan)):
        raise KeyError("an error inside the scope")
    assert compat.get_recompile_limit() == 2  # put back on error too


def test_cache_key_follows_extra_and_the_other_modes(tmp_path):
    plan = ShapePlan.from_function([(2, 4), (2, 8)], lambda s: torch.ones(s))
    model = nn.Linear(4, 4)
    plain = Cache(tmp_path).key(job_of(plan, model=model))
    assert plain == Cache(tmp_path).key(job_of(plan, model=model))
    assert plain != Cache(tmp_path, "mode=max-autotune").key(job_of(plan, model=model))
    assert plain != Cache(tmp_path).key(job_of(plan, model=model, modes=[Inference()]))
    job = job_of(plan, model=model)
    Cache(tmp_path).setup(job)
    assert job.report.cache_path == str(tmp_path / plain) and not job.report.cache_loaded
    with pytest.raises(ShapeBucketError, match="Cache\\(dir\\) must be a path"):
        Cache(3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("after", "loaded", "saved"),
    [
        ((0, 1), False, True),  # inductor compiled a graph anew
        ((3, 0), False, True),  # this machine's inductor cache served it; the dir held nothing
        ((3, 0), True, False),  # served from what the dir itself restored: nothing new
        ((0, 0), False, False),  # nothing compiled (an eager backend)
    ],
)
def test_cache_saves_what_the_next_machine_would_lack(tmp_path, monkeypatch, after, loaded, saved):
    plan = ShapePlan.from_function([(2, 4)], lambda s: torch.ones(s))
    job = job_of(plan, model=nn.Linear(4, 4))
    calls = []
    monkeypatch.setattr(compat, "inductor_cache_counts", lambda: (0, 0))
    monkeypatch.setattr(
        "shapebucket.compile.modes.cached.save_held_compile_cache",
        lambda path, extra: calls.append(path),
    )
    Cache(tmp_path).setup(job)
    job.report.cache_loaded = loaded
    monkeypatch.setattr(compat, "inductor_cache_counts", lambda: after)
    Cache(tmp_path).finish(job)
    assert (len(calls) == 1) == saved == job.report.cache_saved


def test_no_recompiles_names_the_plan():
    f = torch.compile(lambda x: x + 1, **EAGER)
    plan = ShapePlan.from_function([(2, 8)], torch.ones)
    f(torch.ones(2, 8))
    expected = r"shapes \(rows, length\) are \[\(2, 8\)\]"
    with pytest.raises(ShapeBucketError, match=expected), no_recompiles(plan):
        f(torch.ones(2, 16))


# -- import side effects and the recompile-limit record ------------------------------------


def test_limit_hits_are_counted_without_a_handler_and_forgotten_on_reset():
    f = compile_with_limit(lambda x: x * 2, 2, **EAGER)
    for n in (2, 3, 4):
        f(torch.ones(n))
    assert compat.recompile_limit_hits() == 1
    with pytest.warns(UserWarning, match="1 compiled function"), no_recompiles():
        pass
    compat.reset_compiler()
    assert compat.recompile_limit_hits() == 0


# -- what prewarm restores (issue 22 item 11) -------------------------------------------------


class Counted(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 1)
        self.seen = torch.zeros(())  # a plain tensor attribute, not a buffer

    def forward(self, x):
        self.seen = self.seen + x.shape[0]
        return self.lin(x).pow(2).mean()


def test_prewarm_restores_scaler_ema_scheduler_tensor_attributes_and_requires_grad():
    torch.manual_seed(0)
    model = Counted()
    ema = Counted()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    frozen = model.lin.bias

    def step(x):
        frozen.requires_grad_(False)  # a step that freezes a parameter
        scaler.scale(model(x)).backward()
        scaler.step(opt)
        scaler.update()
        sched.step()
        with torch.no_grad():
            for e, p in zip(ema.parameters(), model.parameters(), strict=True):
                e.mul_(0.9).add_(p, alpha=0.1)

    before = (
        scaler.state_dict(),
        sched.state_dict(),
        opt.param_groups[0]["lr"],
        [p.clone() for p in ema.parameters()],
    )
    plan = ShapePlan.from_function([(2, 4), (3, 4)], lambda s: torch.randn(s))
    prewarm(model, plan, step=step, restore=[opt, scaler, sched, ema], progress=False)
    assert scaler.state_dict() == before[0] and sched.state_dict() == before[1]
    assert opt.param_groups[0]["lr"] == before[2]
    assert all(torch.equal(p, q) for p, q in zip(ema.parameters(), before[3], strict=True))
    assert model.seen.item() == 0 and frozen.requires_grad  # seen automatically


def test_restore_refuses_what_it_cannot_snapshot():
    plan = ShapePlan.from_function([(2, 4)], torch.ones)
    with pytest.raises(ShapeBucketError, match="cannot snapshot a dict"):
        prewarm(None, plan, step=print, restore=[{"steps": 0}])


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"restore": 5}, "restore must be a list of objects to snapshot"),
        ({"restore": None}, "restore must be a list of objects to snapshot"),
        ({"modes": Inference}, "instances, not classes"),
        ({"modes": None}, "modes must be a list"),
        ({"modes": 3}, "modes must be a list"),
        ({"modes": "Inference"}, "modes must be a list"),
        ({"step": 5}, "step must be a function"),
    ],
)
def test_prewarm_refuses_arguments_of_the_wrong_kind_before_compiling(kwargs, needle):
    """Probe: these raised a raw TypeError ('int' object is not iterable / callable)."""
    plan = ShapePlan.from_function([(2, 4)], torch.ones)
    model = torch.compile(nn.Linear(4, 2), **EAGER)
    with CompileCounter() as cc, pytest.raises(ShapeBucketError, match=needle):
        prewarm(model, plan, progress=False, **kwargs)
    assert cc.graphs == 0


def test_prewarm_refuses_a_model_it_cannot_call():
    plan = ShapePlan.from_function([(2, 4)], torch.ones)
    with pytest.raises(ShapeBucketError, match="model is a str .* cannot be called"):
        prewarm("model.pt", plan, progress=False)


def test_cache_refuses_a_file_where_its_directory_goes(tmp_path):
    """Probe: Cache(dir) with a file there raised a raw FileExistsError."""
    (tmp_path / "cache").write_text("not a directory")
    plan = ShapePlan.from_function([(2, 4)], torch.ones)
    model = torch.compile(nn.Linear(4, 2), **EAGER)
    with pytest.raises(ShapeBucketError, match="is not a directory"):
        prewarm(model, plan, progress=False, modes=[Cache(tmp_path / "cache")])
    with pytest.raises(ShapeBucketError, match="is not a directory"):
        Cache(tmp_path / "cache" / "sub")._check_dir(tmp_path / "cache" / "sub" / "key")
    with pytest.raises(ShapeBucketError, match="working directory"):
        Cache("")  # probe: Path("") is ".", the cache went into the working directory
    with pytest.raises(ShapeBucketError, match=r"AotCache\(dir='  '\) would write"):
        AotCache("  ")  # the class and the value as given (it said Cache(dir=''))


def test_prewarm_flags_must_be_bools():
    """Probe: verify="yes", progress=5 and RecompileLimit("no") were taken as truthy."""
    plan = ShapePlan.from_function([(2, 4)], torch.ones)
    for kwargs in ({"verify": "yes"}, {"progress": 5}, {"verify": None}):
        with pytest.raises(ShapeBucketError, match="must be True or False"):
            prewarm(None, plan, step=lambda b: None, **kwargs)
    with pytest.raises(ShapeBucketError, match=r"RecompileLimit\(raise_limit\) must be True or"):
        RecompileLimit("no")  # type: ignore[arg-type]
