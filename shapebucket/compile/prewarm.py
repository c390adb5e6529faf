"""``prewarm``: compile every shape of a plan before training, then put everything back."""

from __future__ import annotations

import contextlib
import copy
import math
import time
import warnings
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any

import torch

from .. import _torch as compat
from .._progress import progress as progress_bar
from .._torch.version import recompile_limit_fix
from .._validate import check_flag
from ..collate.bucket import BucketCollator
from ..errors import ShapeBucketError
from ..plan.coerce import as_plan
from ..plan.shapes import ShapePlan
from .cache.aot import AotCache
from .calls import check_callables, refuse_cached_decoder, run_batch
from .modes.base import Job, Mode
from .modes.cached import Cache
from .modes.run import CudaGraphs, RecompileLimit, Repeat
from .recompiles import CompileCounter, no_recompiles
from .report import PrewarmReport
from .state import Snapshot, optimizers_stepped, restore_objects, snapshot
from .state import restore as restore_state

__all__ = ["prewarm"]


_MODES = "Cache(dir), AotCache(dir), Inference(), CudaGraphs(), Repeat(n), RecompileLimit()"


def _check_modes(modes: Iterable[Mode]) -> tuple[Mode, ...]:
    if isinstance(modes, Mode):
        modes = (modes,)
    if isinstance(modes, (str, bytes, type)) or not isinstance(modes, Iterable):
        raise ShapeBucketError(
            f"modes must be a list of shapebucket.compile modes ({_MODES}), got {modes!r}; "
            "pass () for none and instances, not classes: modes=[Inference()]"
        )
    checked = tuple(modes)
    for m in checked:
        if not isinstance(m, Mode):
            raise ShapeBucketError(f"modes must be shapebucket.compile modes ({_MODES}), got {m!r}")
    kinds = [type(m).__name__ for m in checked]
    repeats = sum(isinstance(m, (Repeat, CudaGraphs)) for m in checked)
    if len({type(m) for m in checked}) != len(checked) or repeats > 1:
        raise ShapeBucketError(f"pass each mode once (and one of Repeat, CudaGraphs), got {kinds}")
    aot = [m for m in checked if isinstance(m, AotCache)]
    others = [type(m).__name__ for m in checked if isinstance(m, (Cache, CudaGraphs))]
    if aot and len(others) > 1:
        others.remove(type(aot[0]).__name__)
        raise ShapeBucketError(
            f"AotCache cannot be combined with {', '.join(others)} (static whole graphs, one "
            "cache directory); pass Cache(dir) instead of AotCache for those"
        )
    if not any(isinstance(m, RecompileLimit) for m in checked):
        checked = (RecompileLimit(), *checked)
    return checked


def _how(graphs: int, hits: int, misses: int) -> str:
    if graphs == 0:
        return "none"
    return "cache" if hits > 0 and misses == 0 else "compiled"


def _compile_shapes(job: Job, run: Callable[[Any], None], progress: bool) -> None:
    """Run every shape's batch (``runs`` times), recording seconds, graphs, how and memory."""
    report, modes = job.report, job.modes
    runs = max(m.runs for m in modes)
    start = time.perf_counter()
    bar = progress_bar(list(job.plan), desc="prewarm", unit="shape", enabled=progress)
    for shape in bar:
        bar.set_postfix_str(
            f"{shape.rows}x{shape.length}, {time.perf_counter() - start:.0f} s so far"
        )
        t0 = time.perf_counter()
        hits0, misses0 = compat.inductor_cache_counts()
        on_cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        mem0 = torch.cuda.memory_allocated() if on_cuda else 0
        job.shape = shape
        with CompileCounter() as cc:
            batch = job.batch(shape)
            for _ in range(runs):
                run(_own(batch))
        if on_cuda:
            torch.cuda.synchronize()
            report.memory_mb[shape] = (torch.cuda.memory_allocated() - mem0) / 2**20
        hits, misses = compat.inductor_cache_counts()
        report.seconds[shape] = time.perf_counter() - t0
        report.graphs[shape] = cc.graphs
        report.backward_graphs[shape] = cc.backward_graphs
        report.how[shape] = _how(cc.graphs, hits - hits0, misses - misses0)
    report.total_seconds = time.perf_counter() - start


def _own(batch: Any) -> Any:
    """A run's own container of the batch's values, so that a step that pops or sets a
    key (``batch.pop("labels")``) leaves the next run its batch; the tensors are shared."""
    return copy.copy(batch) if isinstance(batch, (MutableMapping, list)) else batch


def _settle(job: Job, run: Callable[[Any], None]) -> None:
    """One run of the smallest shape with the compiler off, so that a model that sets its own
    state in its first call compiles every graph in its settled state (see :func:`prewarm`)."""
    shape = min(job.plan, key=math.prod)
    with torch.compiler.set_stance("force_eager"):
        run(_own(job.batch(shape)))


def _verify(job: Job, run: Callable[[Any], None]) -> None:
    """Every shape once more, from the restored state, under no_recompiles."""
    t0 = time.perf_counter()
    job.shape = None
    with no_recompiles(job.plan):
        for shape in job.plan:
            run(job.batch(shape))
    job.report.verify_seconds = time.perf_counter() - t0


def _prewarm_job(job: Job, extra: list[Any], verify: bool, progress: bool) -> None:
    """Snapshot; inside the modes' scopes set up, compile every shape, restore, check the
    recompile limit, verify and restore again; then the modes finish."""

    def run(batch: Any) -> None:
        with contextlib.ExitStack() as stack:
            for m in job.modes:
                stack.enter_context(m.context())
            run_batch(job.model, job.step, batch)

    def put_back(found: dict[torch.optim.Optimizer, Snapshot]) -> None:
        for other in found.values():
            restore_state(other)
        restore_state(snap)  # last: its RNG states and parameters are from before prewarm

    snap = snapshot(job.model, *extra)  # first: batches made from here on draw no lasting RNG
    hits_before = compat.recompile_limit_hits()
    with contextlib.ExitStack() as scopes:  # the recompile limit, put back also on error
        for m in job.modes:
            scopes.enter_context(m.scope(job))
        optimizers = (o for o in extra if isinstance(o, torch.optim.Optimizer))
        found = scopes.enter_context(optimizers_stepped(optimizers))
        try:
            _settle(job, run)
            for m in job.modes:
                m.setup(job)
            with CompileCounter() as watch:
                _compile_shapes(job, run, progress)
        finally:
            put_back(found)
        if compat.recompile_limit_hits() > hits_before or watch.limit_hits:
            said = watch.limit_hits[-1] if watch.limit_hits else "(no message)"
            raise ShapeBucketError(
                f"prewarm: a compiled function hit the recompile limit ({job.report.limit}), so it "
                "runs eagerly for some shapes: it compiled more than one graph per shape, or it was "
                f"compiled for other shapes before. Compile it with {recompile_limit_fix('N')} "
                "for N >= the graphs it needs (a graph per shape for each mode it runs in: "
                f"{2 * len(job.plan)} for training and evaluation of these {len(job.plan)} "
                "shapes), or use fewer buckets.\n"
                f"compiler said: {said}"
            )
        if verify:
            try:
                _verify(job, run)
            finally:
                put_back(found)
    job.report.optimizers_found = len(found)
    for m in job.modes:
        m.finish(job)


def prewarm(
    model: Any,
    plan: ShapePlan | Iterable[int],
    example: Any = None,
    *,
    step: Callable[[Any], Any] | None = None,
    restore: Iterable[Any] = (),
    modes: Iterable[Mode] = (),
    verify: bool = True,
    progress: bool = True,
) -> PrewarmReport:
    """Compile every shape of ``plan`` before training, then put everything back as it was.

    ``plan`` is a :class:`ShapePlan`, or the buckets with ``example=`` (a batch of the
    loader): each bucket at the example's rows (:func:`~shapebucket.plan.coerce.as_plan`).

    For each shape, ``plan.batch(example, shape)`` (the collator re-pads
    ``example``, a real batch it made; or the plan's ``make_batch``) runs
    through ``step(batch)`` (a whole training step), or else ``model(**batch)``
    / ``model(*batch)`` and a backward: ``backward()`` on a scalar output (or its
    ``.loss``) that requires grad, else from every output tensor that requires
    grad with a gradient of ones (logits, hidden states), so forward and backward
    compile. Nothing requires grad under ``torch.no_grad()`` (prewarm inside it for
    an evaluation loop that runs under it) or with :class:`Inference`: forward only.

    First the plan's smallest shape runs once with the compiler off, so that a
    model that sets its own state in its first call (transformers sets
    ``config.problem_type``) has every graph compiled in its settled state.

    Afterwards everything the step changed is restored bitwise, in place
    (:mod:`shapebucket.compile.state`): the model's parameters, ``.grad``s,
    ``requires_grad`` flags, buffers, tensor attributes and train flags; the
    torch, numpy and Python RNGs; every object in ``restore`` (the optimizer, a
    ``GradScaler``, an EMA model, LR schedulers, tensors); and any optimizer
    that steps without being passed (found by a global pre-hook, removed
    afterwards; ``report.optimizers_found``). With ``verify=True`` every shape
    runs once more under :func:`no_recompiles` and is restored again.

    ``modes`` change how graphs are made (:mod:`shapebucket.compile.modes`):
    ``Cache(dir)``, ``AotCache(dir)``, ``Inference()``, ``CudaGraphs()``,
    ``Repeat(n)``, ``RecompileLimit(raise_limit=False)``. By default the
    recompile limit is raised to the number of shapes when it is lower, for the
    prewarm, and put back afterwards (the graphs stay usable: the limit caps new
    compiles, not the use of compiled ones). A
    function that hits the limit anyway raises :class:`ShapeBucketError`;
    compiling 0 graphs gives a warning.

    >>> model = torch.compile(torch.nn.Linear(4, 2), dynamic=False, backend="eager")
    >>> plan = ShapePlan.from_function([(8, 4), (16, 4)], lambda s: torch.ones(s.rows, s.length))
    >>> report = prewarm(model, plan, progress=False)
    >>> report.total_graphs, report.num_shapes
    (2, 2)
    """
    plan = as_plan(plan, example, BucketCollator)
    check_callables(model, step, "prewarm")
    check_flag("verify", verify)
    check_flag("progress", progress)
    if plan.collator is not None and plan.collator.packs:  # the protocol's marker
        refuse_cached_decoder(model, "prewarm")
    restore = restore_objects(restore, "prewarm")
    job = Job(model, step, plan, example, PrewarmReport(plan.shapes), _check_modes(modes))
    _prewarm_job(job, restore, verify, progress)
    if job.report.total_graphs == 0:
        warnings.warn(
            "prewarm compiled 0 graphs: the model is not torch.compile'd (pass the compiled "
            "model, or a step that calls it), torch.compile skipped it, or it was already "
            "compiled for every shape before this call (then nothing is wrong)",
            stacklevel=2,
        )
    return job.report
