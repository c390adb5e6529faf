"""The benchmark's compile-while-training warm-up (``bench.runner.prepare_background``): it
trains until the background has switched every shape, however many steps that takes."""

import gc
import types

import torch

from shapebucket.bench import batching, cli, harness, runner


def quick_setup(*flags):
    args = cli._parser().parse_args(
        ["--quick", "--samples", "400", "--epoch-samples", "40", *flags]
    )
    cli._resolve(args)
    return harness._setup(args)


class FakeBackground:
    """``compile_in_background``'s handle without a background process: every shape
    switches after ``steps`` training calls; with ``every``, counts the live tensors at every
    ``every``-th call (a count is a full ``gc.collect()`` and a walk of every object: about
    a second)."""

    def __init__(self, steps, plan, model, every=None):
        self.steps, self.every, self.calls, self.live = steps, every, 0, []
        self.shapes = list(plan)
        self.report = types.SimpleNamespace(switched_at={}, error=None, to_dict=dict)
        model.register_forward_pre_hook(self._called)

    def _called(self, *_):
        self.calls += 1
        if self.every and self.calls % self.every == 0:
            gc.collect()
            self.live.append(sum(issubclass(type(o), torch.Tensor) for o in gc.get_objects()))
        if self.calls == self.steps:
            self.report.switched_at = dict.fromkeys(self.shapes, 0.0)

    @property
    def done(self):
        return self.calls >= self.steps

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def test_a_long_warm_up_keeps_no_tensor_per_step(monkeypatch):
    # a loss tensor kept per warm-up step sits between the steps' freed activations and
    # fragments the heap: the process grew by about 1 MB a step (21.8 GB after a 38-minute
    # warm-up under load); the warm-up keeps its losses as floats until it ends. The live
    # tensors are counted every 8 steps: a tensor kept per step shows as 8 more at each
    # count (counting at every step cost a second a step and showed nothing more). The
    # count at step 8 is the warm-up's: it was 70 higher than the later ones in one CI run
    # (what the first steps leave behind), so the steps from 16 to 40 are compared
    s = quick_setup()
    fam = batching.build_family("packed", s)
    made = []

    def fake(build, plan, example, *, model, **_):
        made.append(FakeBackground(40, plan, model, every=8))
        return made[0]

    monkeypatch.setattr(runner, "compile_in_background", fake)
    warmed = runner.prepare_background("shapebucket-packed-background", s, fam)
    (bg,) = made
    assert bg.calls == warmed.result.warmup_steps == 40 and len(bg.live) == 5
    assert max(bg.live[1:]) == min(bg.live[1:])  # no tensor more after 24 more steps
    # the losses reach the record as they were: one a step, the step's loss
    assert len(warmed.losses) == 40 and all(x.dim() == 0 for x in warmed.losses)
    assert torch.isfinite(torch.stack(warmed.losses)).all()


def test_the_background_runs_at_the_niceness_asked_for(monkeypatch):
    s = quick_setup("--background-nice", "3")
    fam = batching.build_family("packed", s)
    made = []

    def fake(build, plan, example, *, model, options, **_):
        made.append(options.nice)
        return FakeBackground(2, plan, model)

    monkeypatch.setattr(runner, "compile_in_background", fake)
    runner.prepare_background("shapebucket-packed-background", s, fam)
    assert made == [3]
