"""Compile while training: the handle that trains eagerly and switches each shape to its
compiled graph once the background process has published it (``docs/compile.md``,
"Compile while training")."""

from __future__ import annotations

import contextlib
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ... import _torch as compat
from ...collate.bucket import BucketCollator
from ...errors import ShapeBucketError
from ...plan.coerce import as_plan
from ...plan.contract import walk_batch
from ...plan.shapes import Shape, ShapePlan
from ..calls import packed_plan, refuse_cached_decoder
from ..recompiles import CompileCounter
from .process import BackgroundProcess, Spec, compiled_forward, published_shapes
from .report import BackgroundReport
from .setup import (
    BackgroundOptions,
    check_model,
    check_picklable,
    order_shapes,
    output_dir,
)

__all__ = ["BackgroundCompile", "BackgroundOptions", "compile_in_background"]


def _signature(args: Any) -> tuple[tuple[int, ...], ...]:
    return tuple(sorted(tuple(v.shape) for _, v in walk_batch(args) if isinstance(v, torch.Tensor)))


def _contains(big: tuple[tuple[int, ...], ...], small: tuple[tuple[int, ...], ...]) -> bool:
    return not Counter(small) - Counter(big)  # every shape of small, as often, in big


class BackgroundCompile:
    """The handle :func:`compile_in_background` returns: ``.model`` to train, ``.poll()`` (the
    shapes switched to compiled code so far), ``.done``, ``.wait()``, ``.report`` and
    ``.close()`` (also a context manager). See :func:`compile_in_background`."""

    def __init__(self, model: torch.nn.Module, spec: Spec, options: BackgroundOptions):
        self._closed = False
        self.model = model
        self._spec = spec
        self._options = options
        # the spawned process and the directory it publishes into, kept with a cache_dir
        self._background = BackgroundProcess(Path(spec.out), keep=options.cache_dir is not None)
        self._poll_seconds = float(options.poll_seconds)
        self._next_poll = 0.0
        self._start = time.perf_counter()
        self._compiled: Callable[..., Any] | None = None  # made at the first switch
        self._eager = type(model).forward
        self._loaded: list[Shape] = []
        self._switched: set[Shape] = set()
        self._signatures = {s: _signature(spec.plan.batch(spec.example, s)) for s in spec.plan}
        self._memo: dict[tuple[tuple[int, ...], ...], Shape | None] = {}
        self._warned = False
        self._settled = False  # the first training call runs eagerly (see _forward)
        self.report = BackgroundReport(tuple(spec.order))
        # the recompile limit is raised for the handle's life (one graph per shape in this
        # process too) and put back by close(), also when the start fails
        self._limit = contextlib.ExitStack()
        self.report.limit_raised_from = self._limit.enter_context(
            compat.raised_recompile_limit(spec.limit)
        )
        # an instance attribute: hooks, state_dict and the parameters stay the model's own
        model.forward = self._forward  # type: ignore[method-assign]

    # -- the training side ------------------------------------------------------------

    def _fn(self, *args: Any, **kwargs: Any) -> Any:
        """The compiled forward, made at the first switch (``torch.compile`` imports the
        compiler: seconds that the first, eager, steps do not wait for)."""
        if self._compiled is None:
            self._compiled = compiled_forward(self.model, self._spec.compile_options)
        return self._compiled(*args, **kwargs)

    def _shape_of(self, args: Any, kwargs: Any) -> Shape | None:
        sig = _signature((args, kwargs))
        if sig not in self._memo:
            found = [s for s, big in self._signatures.items() if _contains(big, sig)]
            self._memo[sig] = found[0] if len(found) == 1 and sig else None
        return self._memo[sig]

    def _training_call(self) -> bool:
        """A call the background compiled: grad on, no inference mode, training mode."""
        return (
            torch.is_grad_enabled()
            and not torch.is_inference_mode_enabled()
            and self.model.training
        )

    def _forward(self, *args: Any, **kwargs: Any) -> Any:
        now = time.perf_counter()
        if self.report.first_call_seconds is None:
            self.report.first_call_seconds = now - self._start
        if now >= self._next_poll and not self._closed:
            self.poll()
        shape = self._shape_of(args, kwargs)
        rep = self.report
        if shape is None:
            rep.unplanned_calls += 1
        elif not self._training_call():
            rep.eval_calls[shape] += 1  # its graph is not the background's: eager
        elif not self._settled:
            # a model that sets its own state in its first call (config.problem_type of a
            # transformers classifier) would trace its graph before that and recompile on
            # the next call: the first training call settles it, eagerly, as prewarm does
            self._settled = True
            rep.eager_calls[shape] += 1
        elif shape in self._switched:
            rep.compiled_calls[shape] += 1
            with torch.compiler.set_stance("fail_on_recompile"):
                return self._fn(self.model, *args, **kwargs)
        elif shape in self._loaded and not self._closed:
            rep.compiled_calls[shape] += 1
            return self._switch(shape, args, kwargs)
        else:
            rep.eager_calls[shape] += 1
        return self._eager(self.model, *args, **kwargs)

    def _switch(self, shape: Shape, args: Any, kwargs: Any) -> Any:
        """The first compiled call of ``shape``: trace it and load its code from the cache."""
        before = compat.cache_hit_counts()
        t0 = time.perf_counter()
        # a planned compile: allowed inside the user's no_recompiles() (the graph is new to
        # this process, its code comes from the cache), never again for this shape after
        with CompileCounter() as cc, torch.compiler.set_stance("default"):
            out = self._fn(self.model, *args, **kwargs)
        after = compat.cache_hit_counts()
        rep = self.report
        rep.switch_seconds[shape] = time.perf_counter() - t0
        rep.switched_at[shape] = time.perf_counter() - self._start
        rep.graphs[shape] = cc.graphs
        misses = after["aot_miss"] - before["aot_miss"] + after["fx_miss"] - before["fx_miss"]
        hits = after["aot_hit"] - before["aot_hit"]
        rep.how[shape] = "compiled here" if misses else "cache" if hits else "traced"
        self._switched.add(shape)
        if misses and not self._warned:
            self._warned = True
            warnings.warn(
                f"compile_in_background: shape {tuple(shape)} missed the background's cache and "
                "compiled in the training process; the two processes made different graphs (a "
                "step that calls the model differently from step=, other compile options, "
                "autocast or grad mode, or another torch)",
                stacklevel=4,
            )
        return out

    def poll(self) -> tuple[Shape, ...]:
        """Load every shape the background has published since the last poll; returns
        the shapes loaded so far, in the order they became ready. Called by the model's
        forward every ``poll_seconds``."""
        self._next_poll = time.perf_counter() + self._poll_seconds
        look = self._background.look()
        for published in look.published:
            shape = published.shape
            if published.loaded:
                self.report.compile_seconds[shape] = published.seconds
                self.report.ready_at[shape] = time.perf_counter() - self._start
                self._loaded.append(shape)
            else:  # damaged: it stays eager (load_compile_cache warned)
                self.report.how[shape] = "load failed"
                self.report.error = f"shape {tuple(shape)}: its published cache did not load"
        if look.error is not None and self.report.error is None:
            self.report.error = look.error
            warnings.warn(
                "compile_in_background: the background process failed; shapes not ready run "
                f"eagerly. Its error:\n{self.report.error}",
                stacklevel=3,
            )
        elif look.ended and not look.done and self.report.error is None and not self.done:
            # exit code 0 too: a build() that calls os._exit(0) would otherwise hang wait()
            self.report.error = (
                f"the background process ended (exit code {self._background.exitcode}) with "
                f"{len(self._loaded)} of {len(self._spec.order)} shapes published; shapes not "
                "ready run eagerly"
            )
        if self.done and self.report.all_ready_seconds is None:
            self.report.all_ready_seconds = time.perf_counter() - self._start
        return tuple(self._loaded)

    @property
    def done(self) -> bool:
        """Whether every shape of the plan is ready."""
        return len(self._loaded) == len(self._spec.order)

    def wait(self, timeout: float | None = None) -> BackgroundReport:
        """Block until every shape is ready; raises :class:`ShapeBucketError` when the
        background process failed or ``timeout`` seconds passed first."""
        end = None if timeout is None else time.perf_counter() + timeout
        while not self.done:
            self.poll()
            if self.report.error is not None:
                raise ShapeBucketError(
                    f"compile_in_background failed: {self.report.error.strip().splitlines()[-1]}"
                    f"\n{self.report.error}"
                )
            if end is not None and time.perf_counter() > end:
                raise ShapeBucketError(
                    f"compile_in_background: {len(self._loaded)} of {len(self._spec.order)} "
                    f"shapes ready after {timeout} s; wait longer or keep training eagerly"
                )
            time.sleep(min(0.05, self._poll_seconds))
        self.poll()
        return self.report

    def close(self) -> None:
        """Stop the background process (if running), remove its files unless
        ``cache_dir`` was given, and put the recompile limit back. Shapes already
        switched stay compiled; the others run eagerly from now on."""
        self._closed = True
        self._background.stop()
        self._limit.close()

    def __enter__(self) -> BackgroundCompile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"BackgroundCompile({len(self._loaded)}/{len(self._spec.order)} shapes ready)"

    def launch(self) -> None:
        """Spawn the background process (``compile_in_background`` calls it once)."""
        self._background.start(self._spec, self._options.nice)


def compile_in_background(
    build: Callable[[], torch.nn.Module],
    plan: ShapePlan | list[int],
    example: Any = None,
    *,
    model: torch.nn.Module | None = None,
    step: Callable[[torch.nn.Module, Any], Any] | None = None,
    sampler: Any = None,
    options: BackgroundOptions | None = None,
) -> BackgroundCompile:
    """Start training at once: every shape of ``plan`` compiles in a background process
    while ``.model`` runs eagerly, and each shape switches to its compiled graph when ready.

    ``build()`` makes the model (``.model`` is ``build()``'s result unless ``model=`` is
    given: the same class, with any weights; the background's weights never matter, the
    parameters are graph inputs). The background process is *spawned* on one core and
    runs, per shape (most frequent first with ``sampler=``), ``model(**batch)`` and
    ``backward()``, or ``step(model, batch)``: pass the call your training step makes
    (the same keys, autocast), else the graphs differ and the training process
    compiles them itself (a warning says so). Evaluation calls (no grad, inference
    mode, ``model.eval()``) run eagerly. ``build``, ``step``, ``plan`` and ``example``
    must pickle; both processes must run the same code and torch. ``options``
    (:class:`BackgroundOptions`): the ``torch.compile`` arguments, a ``cache_dir`` that
    keeps the compiled shapes for the next run, ``poll_seconds`` and the background's
    ``nice``.

    >>> opts = BackgroundOptions(compile_options={"backend": "eager"})
    >>> bg = compile_in_background(build_model, plan, example, options=opts)  # doctest: +SKIP
    >>> bg.model(**example).shape  # doctest: +SKIP
    torch.Size([])
    """
    plan = as_plan(plan, example, BucketCollator, caller="compile_in_background")
    if not callable(build):
        raise ShapeBucketError(f"build must be a function () -> nn.Module, got {build!r}")
    if step is not None and not callable(step):
        raise ShapeBucketError(f"step must be a function (model, batch) -> None, got {step!r}")
    if options is None:
        options = BackgroundOptions()
    if not isinstance(options, BackgroundOptions):
        raise ShapeBucketError(
            f"options must be a BackgroundOptions(compile_options=, cache_dir=, poll_seconds=, nice=), "
            f"got {type(options).__name__}"
        )
    check_picklable(build=build, step=step, plan=plan, example=example)
    model = check_model(model, build)
    if packed_plan(plan):
        refuse_cached_decoder(model, "compile_in_background")
    order = order_shapes(plan, sampler)
    out = output_dir(options, model, step, (plan, example, order))
    limit = max(compat.get_recompile_limit(), len(plan))
    spec = Spec(build, plan, example, step, dict(options.compile_options), order,
                torch.get_num_threads(), limit, out, published_shapes(out))  # fmt: skip
    bg = BackgroundCompile(model, spec, options)
    try:
        bg.poll()
        if not bg.done:
            bg.launch()
    except BaseException:
        bg.close()
        raise
    return bg
