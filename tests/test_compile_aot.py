"""AotCache: every call prewarm makes compiled ahead of time, saved with the cache and
loaded by the next run, which then traces nothing; any call the loaded functions'
guards reject goes through dynamo as before. The compiling tests use inductor on a
tiny model (a few seconds a shape)."""

from __future__ import annotations

import warnings

import pytest
import torch

from shapebucket import ShapeBucketError, no_recompiles, prewarm
from shapebucket import _torch as compat
from shapebucket.compile import AotCache, Cache, CompileCounter, CudaGraphs
from shapebucket.compile.cache.aot import AOT_FILE, installed
from shapebucket.plan import Shape, ShapePlan

D = 16
SHAPES = [Shape(4, 8), Shape(2, 16)]


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(32, D)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(D, 2 * D), torch.nn.GELU())
        self.out = torch.nn.Linear(2 * D, 32)

    def forward(self, input_ids, labels):
        logits = self.out(self.mlp(self.emb(input_ids)))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def batch(shape: Shape, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + shape.rows * 1000 + shape.length)
    ids = torch.randint(0, 32, (shape.rows, shape.length), generator=g)
    return {"input_ids": ids, "labels": ids.roll(1, dims=1)}


def setup(plan_shapes=SHAPES):
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    compiled = torch.compile(model, dynamic=False)

    def step(b):
        compiled(**b).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, compiled, opt, step, ShapePlan.from_function(plan_shapes, batch)


def losses_and_grads(module, shapes, seed=1):
    out = []
    for s in shapes:
        loss = module(**batch(s, seed))
        loss.backward()
        out.append((loss.detach(), [p.grad.clone() for p in module.parameters()]))
        module.zero_grad(set_to_none=True)
    return out


def assert_same(got, want):
    for (loss, grads), (loss2, grads2) in zip(got, want, strict=True):
        torch.testing.assert_close(loss, loss2)
        for g, g2 in zip(grads, grads2, strict=True):
            torch.testing.assert_close(g, g2)


@pytest.fixture(scope="module")
def cold(tmp_path_factory):
    """One cold prewarm with AotCache: the cache it saved and what the run saw."""
    compat.reset_compiler()
    root = tmp_path_factory.mktemp("aot")
    with compat.fresh_inductor_cache(str(root / "live")):
        model, compiled, opt, step, plan = setup()
        report = prewarm(compiled, plan, step=step, restore=[opt], modes=[AotCache(root / "c")])
        # torch's ahead-of-time compile sets a guard filter on the hooks it is given: the
        # module's own dynamo compiles (every call AotCache passes on) must not get it
        hooks_untouched = compiled.dynamo_ctx._hooks.guard_filter_fn is None
        with CompileCounter() as cc, no_recompiles(plan):
            got = losses_and_grads(compiled, SHAPES)
        want = losses_and_grads(model, SHAPES)
    compat.reset_compiler()
    return {
        "dir": root / "c",
        "report": report,
        "graphs": cc.graphs,
        "got": got,
        "want": want,
        "hooks_untouched": hooks_untouched,
        "live": root / "live",
    }


@pytest.mark.slow
def test_a_cold_run_compiles_every_call_ahead_of_time_and_saves_them(cold):
    report = cold["report"]
    assert report.how == {s: "aot" for s in SHAPES}
    assert report.graphs == {s: 1 for s in SHAPES}
    assert report.cache_saved and not report.cache_loaded
    (saved,) = [p for p in cold["dir"].iterdir() if p.is_dir()]
    assert (saved / AOT_FILE).stat().st_size > 0
    assert AOT_FILE in (saved / "manifest.json").read_text()  # checked like every file
    # training after prewarm runs the ahead-of-time functions: dynamo compiles nothing,
    # and the losses and gradients are the eager model's
    assert cold["graphs"] == 0
    assert_same(cold["got"], cold["want"])
    assert cold["hooks_untouched"]


@pytest.mark.slow
def test_a_warm_run_loads_every_function_and_traces_nothing(cold, fresh_compiler, tmp_path):
    with compat.fresh_inductor_cache(str(tmp_path / "live")):  # empty: the cache brings it
        model, compiled, opt, step, plan = setup()
        with CompileCounter() as during:
            report = prewarm(
                compiled, plan, step=step, restore=[opt], modes=[AotCache(cold["dir"])]
            )
        assert report.cache_loaded and not report.cache_saved
        assert report.how == {s: "aot-cache" for s in SHAPES}
        assert during.graphs == 0  # dynamo traced nothing, prewarm and verify pass included
        with CompileCounter() as cc, no_recompiles(plan):
            got = losses_and_grads(compiled, SHAPES)
        assert cc.graphs == 0
        assert_same(got, losses_and_grads(model, SHAPES))


@pytest.mark.slow
def test_calls_the_functions_do_not_accept_go_through_dynamo_as_before(
    cold, fresh_compiler, tmp_path
):
    with compat.fresh_inductor_cache(str(tmp_path / "live")):
        model, compiled, opt, step, plan = setup()
        prewarm(compiled, plan, step=step, restore=[opt], modes=[AotCache(cold["dir"])])
        other = batch(Shape(3, 8))
        with pytest.raises(ShapeBucketError) as e, no_recompiles(plan):  # an unplanned shape
            compiled(**other)
        assert "input_ids [3, 8], labels [3, 8] matches none" in str(e.value)
        assert "(input_ids [2, 16], labels [2, 16]; input_ids [4, 8], labels [4, 8])" in str(
            e.value
        )
        with CompileCounter() as cc:
            loss = compiled(**other)  # without the guard: compiled through dynamo
        assert cc.graphs == 1
        torch.testing.assert_close(loss, model(**other))
        with torch.no_grad():  # another grad mode: the guards reject it, dynamo serves it
            torch.testing.assert_close(compiled(**batch(SHAPES[0])), model(**batch(SHAPES[0])))
        forward = installed(compiled)
        assert forward is not None and not forward.compiling()  # nothing compiled ahead now


@pytest.mark.slow
def test_a_graph_break_falls_back_to_dynamo_with_a_warning(fresh_compiler, tmp_path):
    class Breaks(Tiny):
        def forward(self, input_ids, labels):
            loss = super().forward(input_ids, labels)
            torch._dynamo.graph_break()
            return loss * 1

    with compat.fresh_inductor_cache(str(tmp_path / "live")):
        torch.manual_seed(0)
        model = Breaks().requires_grad_(False)  # the forward breaks: no backward to compile
        compiled = torch.compile(model, dynamic=False)
        plan = ShapePlan.from_function(SHAPES[:1], batch)
        with pytest.warns(UserWarning, match="ahead-of-time compiling a call of the model failed"):
            report = prewarm(compiled, plan, modes=[AotCache(tmp_path / "c")], progress=False)
        assert report.how[SHAPES[0]] == "compiled" and report.graphs[SHAPES[0]] >= 1
        (saved,) = [p for p in (tmp_path / "c").iterdir() if p.is_dir()]
        assert not (saved / AOT_FILE).exists()  # nothing ahead of time to keep
        torch.testing.assert_close(compiled(**batch(SHAPES[0])), model(**batch(SHAPES[0])))


def test_refusals_before_anything_compiles(tmp_path):
    model = Tiny()
    plan = ShapePlan.from_function(SHAPES[:1], batch)
    with pytest.raises(ShapeBucketError, match="torch.compile'd module itself"):
        prewarm(model, plan, modes=[AotCache(tmp_path)], progress=False)
    hooked = Tiny()
    hooked.register_forward_pre_hook(lambda m, a: None)
    with pytest.raises(ShapeBucketError, match="forward or backward hooks"):
        prewarm(torch.compile(hooked), plan, modes=[AotCache(tmp_path)], progress=False)
    backward = Tiny()
    backward.register_full_backward_hook(lambda m, gi, go: None)
    with pytest.raises(ShapeBucketError, match="forward or backward hooks"):
        prewarm(torch.compile(backward), plan, modes=[AotCache(tmp_path)], progress=False)
    compiled = torch.compile(Tiny(), dynamic=False)
    for other in (CudaGraphs(), Cache(tmp_path / "other")):
        with pytest.raises(ShapeBucketError, match="AotCache cannot be combined with"):
            prewarm(compiled, plan, modes=[AotCache(tmp_path), other], progress=False)
        assert installed(compiled) is None  # a refused prewarm leaves the module as it was


def test_a_failed_prewarm_puts_the_module_s_own_forward_back(tmp_path):
    compiled = torch.compile(Tiny(), dynamic=False, backend="eager")
    plan = ShapePlan.from_function(SHAPES[:1], batch)

    def step(b):
        raise RuntimeError("the step failed")

    with warnings.catch_warnings(), pytest.raises(RuntimeError, match="the step failed"):
        warnings.simplefilter("ignore")
        prewarm(compiled, plan, step=step, modes=[AotCache(tmp_path)], progress=False)
    assert installed(compiled) is None


SCALE = 1.0  # a global the model below reads as a value


def scaled(x, *, by=1.0):  # a global function with a keyword default: code, not a value
    return x * by


class CallsAGlobal(Tiny):
    def forward(self, input_ids, labels):
        return scaled(super().forward(input_ids, labels))


class ReadsAGlobal(Tiny):
    def forward(self, input_ids, labels):
        return super().forward(input_ids, labels) * SCALE


@pytest.mark.slow
def test_globals_hooks_and_grads_never_change_a_result(cold, fresh_compiler, tmp_path):
    """Probe: torch drops the guards on globals of an ahead-of-time function (a changed
    global gave the stale result), the function skipped hooks added after prewarm, and
    functions compiled while parameters held .grad could not be loaded back."""
    global SCALE
    plan = ShapePlan.from_function(SHAPES[:1], batch)
    b = batch(SHAPES[0])
    with compat.fresh_inductor_cache(str(tmp_path / "live")):
        torch.manual_seed(0)
        # frozen weights here: the forward alone reads the global and calls the function
        # (a backward would only double the compiles); the .grad part trains below
        model = ReadsAGlobal().requires_grad_(False)
        compiled = torch.compile(model, dynamic=False)
        with pytest.warns(UserWarning, match="reads global variables"):
            prewarm(compiled, plan, modes=[AotCache(tmp_path / "g")], progress=False)
        SCALE = 3.0
        try:
            torch.testing.assert_close(compiled(**b), model(**b))  # through dynamo: guarded
        finally:
            SCALE = 1.0
        calls = torch.compile(CallsAGlobal().requires_grad_(False), dynamic=False)
        report = prewarm(calls, plan, modes=[AotCache(tmp_path / "f")], progress=False)
        assert report.how == {SHAPES[0]: "aot"}  # a function's defaults do not refuse it

        def accumulating_run():  # a step that leaves .grad set (gradient accumulation)
            model, compiled, _, _, plan = setup()  # the second shape compiles with .grad set
            report = prewarm(
                compiled,
                plan,
                step=lambda x: compiled(**x).backward(),
                modes=[AotCache(tmp_path / "a")],
                progress=False,
            )
            return compiled, model, report

    # Tiny's graphs at SHAPES are in the cold run's inductor cache: compiling them ahead of
    # time again (with .grad set or not, the same graphs) takes them from it
    with compat.fresh_inductor_cache(str(cold["live"])):
        accumulating_run()
        compat.reset_compiler()
        compiled, model, report = accumulating_run()  # the next run loads them
        assert report.how == {s: "aot-cache" for s in SHAPES}
        model.register_forward_hook(lambda m, args, out: out * 0 + 123.0)
        assert compiled(**b).item() == 123.0  # a hook added later: dynamo runs it


def test_a_second_prewarm_reports_its_own_plan_and_a_failed_one_keeps_the_first(tmp_path):
    """Probe: a second prewarm of one module reported the first plan's shapes too, and a
    failed prewarm took away the forward a successful earlier one had installed."""
    compiled = torch.compile(Tiny(), dynamic=False, backend="eager")
    first = ShapePlan.from_function(SHAPES[:1], batch)
    second = ShapePlan.from_function(SHAPES[1:], batch)
    installed_forward = object()

    def fake_compile(compiled_module, args, kwargs):  # no compile: a function of this call
        shapes = {k: tuple(v.shape) for k, v in kwargs.items()}

        class Fn:
            def guard_check(self, module, *a, **kw):
                return {k: tuple(v.shape) for k, v in kw.items()} == shapes

            def fn(self, module, *a, **kw):
                return module(*a, **kw)

        return Fn()

    with (
        warnings.catch_warnings(),
        pytest.MonkeyPatch.context() as mp,
        # an empty inductor cache: each save copies the live cache, which outside one is
        # the machine's default, thousands of files after a test run (4 s a save here)
        compat.fresh_inductor_cache(str(tmp_path / "live")),
    ):
        warnings.simplefilter("ignore")
        mp.setattr(compat, "aot_compile_call", fake_compile)
        mp.setattr(compat, "aot_serialize", lambda functions: b"functions")
        prewarm(compiled, first, modes=[AotCache(tmp_path / "a")], progress=False)
        installed_forward = installed(compiled)
        report = prewarm(compiled, second, modes=[AotCache(tmp_path / "b")], progress=False)
        assert set(report.how) == set(second.shapes) and report.how[SHAPES[1]] == "aot"
        assert prewarm(compiled, first, modes=[AotCache(tmp_path / "a")], progress=False).how == {
            SHAPES[0]: "aot-cache"  # held from the first prewarm: nothing compiled now
        }

        def fails(b):
            raise RuntimeError("the step failed")

        with pytest.raises(RuntimeError, match="the step failed"):
            prewarm(compiled, first, step=fails, modes=[AotCache(tmp_path / "c")], progress=False)
        assert installed(compiled) is installed_forward  # the earlier prewarm's forward stays

        def fails_on_the_second_shape(b):
            if b["input_ids"].shape == (SHAPES[1].rows, SHAPES[1].length):
                raise RuntimeError("the step failed")
            compiled(**b)

        both = ShapePlan.from_function(SHAPES, batch)
        with pytest.raises(RuntimeError, match="the step failed"):
            prewarm(
                compiled, both, step=fails_on_the_second_shape, modes=[AotCache(tmp_path / "d")]
            )
        # the failed prewarm let go of the forward: a later call is not compiled ahead of
        # time as if a prewarm were still running (it compiled in silence, unseen by guards)
        assert installed_forward.job is None and not installed_forward.compiling()
