"""Compile while training: train eagerly at once, switch each shape to its compiled graph
as soon as a background process has compiled it.

::

    with compile_in_background(build_model, plan, example, sampler=sampler) as bg:
        opt = torch.optim.AdamW(bg.model.parameters())
        for batch in loader:
            loss = bg.model(**batch)  # eager until this batch's shape is ready
            loss.backward(); opt.step(); opt.zero_grad()

The background process (:mod:`shapebucket.compile.background.worker`) builds its own model
and publishes each shape's compiled code as a cache directory; the training
process polls for them (at most every ``poll_seconds``, one ``listdir``), loads
each into its compiler cache, and from then on runs that shape through
``torch.compile(type(model).forward)``, whose first call traces the graph and
finds its compiled forward and backward in the cache. A shape that was switched
runs under the ``fail_on_recompile`` stance: it never recompiles.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from ... import _torch_compat as compat
from ...collate.bucket import BucketCollator
from ...errors import ShapeBucketError
from ...plan.coerce import as_plan
from ...plan.shapes import Shape, ShapePlan
from ..cache import MANIFEST, load_compile_cache
from ..key import describe_batch, job_key
from ..recompiles import CompileCounter, walk_batch
from .report import BackgroundReport
from .setup import check_model, check_options, check_picklable, order_shapes, yield_to_training
from .worker import DONE, ERROR, Spec, compiled_forward, install_forward, main

__all__ = ["BackgroundCompile", "compile_in_background"]


def _signature(args: Any) -> tuple[tuple[int, ...], ...]:
    return tuple(sorted(tuple(v.shape) for _, v in walk_batch(args) if isinstance(v, torch.Tensor)))


def _contains(big: tuple[tuple[int, ...], ...], small: tuple[tuple[int, ...], ...]) -> bool:
    pool = list(big)
    for s in small:
        if s not in pool:
            return False
        pool.remove(s)
    return True


class BackgroundCompile:
    """The handle :func:`compile_in_background` returns: ``.model`` to train, ``.ready`` (the
    shapes switched to compiled code so far), ``.done``, ``.wait()``, ``.report`` and
    ``.close()`` (also a context manager). See :func:`compile_in_background`."""

    def __init__(self, model: torch.nn.Module, spec: Spec, poll_seconds: float, keep: bool):
        self.model = model
        self._spec = spec
        self._out = Path(spec.out)
        self._keep = keep
        self._poll_seconds = poll_seconds
        self._next_poll = 0.0
        self._start = time.perf_counter()
        self._compiled: Callable[..., Any] | None = None  # made at the first switch
        self._eager = type(model).forward
        self._loaded: list[Shape] = []
        self._switched: set[Shape] = set()
        self._seen: set[str] = set()
        self._signatures = {s: _signature(spec.plan.batch(spec.example, s)) for s in spec.plan}
        self._memo: dict[tuple[tuple[int, ...], ...], Shape | None] = {}
        self._process: Any = None
        self._warned = False
        self.report = BackgroundReport(tuple(spec.order))
        install_forward(model, self._forward)

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

    def _forward(self, *args: Any, **kwargs: Any) -> Any:
        now = time.perf_counter()
        if self.report.first_call_seconds is None:
            self.report.first_call_seconds = now - self._start
        if now >= self._next_poll:
            self.poll()
        shape = self._shape_of(args, kwargs)
        rep = self.report
        if shape is None or shape not in self._loaded:
            if shape is None:
                rep.unplanned_calls += 1
            else:
                rep.eager_calls[shape] += 1
            return self._eager(self.model, *args, **kwargs)
        rep.compiled_calls[shape] += 1
        if shape in self._switched:
            with compat.stance("fail_on_recompile"):
                return self._fn(self.model, *args, **kwargs)
        return self._switch(shape, args, kwargs)

    def _switch(self, shape: Shape, args: Any, kwargs: Any) -> Any:
        """The first compiled call of ``shape``: trace it and load its code from the cache."""
        before = compat.cache_hit_counts()
        t0 = time.perf_counter()
        # a planned compile: allowed inside the user's no_recompiles() (the graph is new to
        # this process, its code comes from the cache), never again for this shape after
        with CompileCounter() as cc, compat.stance("default"):
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
        the shapes loaded so far. Called by the model's forward every ``poll_seconds``."""
        self._next_poll = time.perf_counter() + self._poll_seconds
        try:
            names = sorted(os.listdir(self._out))
        except FileNotFoundError:
            names = []
        for name in names:
            if not name.endswith(".json") or name == DONE or name in self._seen:
                continue
            self._seen.add(name)
            info = json.loads((self._out / name).read_text())
            shape = Shape(*info["shape"])
            if _load(self._out / name[: -len(".json")]):
                self.report.compile_seconds[shape] = float(info["seconds"])
                self.report.ready_at[shape] = time.perf_counter() - self._start
                self._loaded.append(shape)
            else:  # damaged: it stays eager (load_compile_cache warned)
                self.report.how[shape] = "load failed"
                self.report.error = f"shape {tuple(shape)}: its published cache did not load"
        if ERROR in names and self.report.error is None:
            self.report.error = (self._out / ERROR).read_text()
            warnings.warn(
                "compile_in_background: the background process failed; shapes not ready run "
                f"eagerly. Its error:\n{self.report.error}",
                stacklevel=3,
            )
        elif (
            self._process is not None
            and not self._process.is_alive()
            and DONE not in names
            and self.report.error is None
            and self._process.exitcode not in (0, None)
        ):
            self.report.error = f"the background process died (exit code {self._process.exitcode})"
        if self.done and self.report.all_ready_seconds is None:
            self.report.all_ready_seconds = time.perf_counter() - self._start
        return tuple(self._loaded)

    @property
    def ready(self) -> tuple[Shape, ...]:
        """The shapes whose compiled code is loaded, in the order they became ready."""
        return self.poll()

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
        """Stop the background process (if running) and remove its files unless
        ``cache_dir`` was given. Shapes already switched stay compiled."""
        if self._process is not None and self._process.is_alive():
            self._process.terminate()
            self._process.join(10)
        if not self._keep:
            shutil.rmtree(self._out, ignore_errors=True)

    def __enter__(self) -> BackgroundCompile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"BackgroundCompile({len(self._loaded)}/{len(self._spec.order)} shapes ready)"

    def _launch(self) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        env = {"TORCHINDUCTOR_CACHE_DIR": str(self._out / ".inductor")}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # read by the child at its start, restored at once
        try:
            self._process = ctx.Process(target=main, args=(self._spec,), daemon=True)
            self._process.start()
            yield_to_training(self._process.pid)
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _load(path: Path) -> bool:
    """Load one published shape; a shape whose compiler made no files (a backend without a
    cache, such as ``"eager"``) has a manifest listing none and is ready as it is."""
    try:
        files = json.loads((path / MANIFEST).read_text()).get("files")
    except (OSError, ValueError):
        files = None
    if files == {}:
        return True
    return load_compile_cache(path)


def compile_in_background(
    build: Callable[[], torch.nn.Module],
    plan: ShapePlan | list[int],
    example: Any = None,
    *,
    model: torch.nn.Module | None = None,
    step: Callable[[torch.nn.Module, Any], Any] | None = None,
    sampler: Any = None,
    compile_options: Mapping[str, Any] | None = None,
    cache_dir: str | Path | None = None,
    poll_seconds: float = 0.5,
) -> BackgroundCompile:
    """Start training at once: every shape of ``plan`` compiles in a background process
    while ``.model`` runs eagerly, and each shape switches to its compiled graph when ready.

    ``build()`` makes the model (``.model`` is ``build()``'s result unless ``model=`` is
    given: the same class, with any weights; the background's weights never matter, the
    parameters are graph inputs). The background process is *spawned* on one core and
    runs, per shape (most frequent first with ``sampler=``), ``model(**batch)`` and
    ``backward()``, or ``step(model, batch)``: pass the call your training step makes
    (the same keys, autocast, grad mode), else the graphs differ and the training
    process compiles them itself (a warning says so). ``build``, ``step``, ``plan``
    and ``example`` must pickle; both processes must run the same code and torch.
    ``compile_options`` go to ``torch.compile`` in both (``dynamic=False`` is set).
    ``cache_dir`` keeps the compiled shapes in ``cache_dir/<key>`` for the next run
    (default: a temporary directory, removed by ``close()``).

    >>> bg = compile_in_background(lambda: torch.nn.Linear(2, 2), plan=None)  # doctest: +SKIP
    >>> bg.model(torch.ones(4, 2)).shape  # doctest: +SKIP
    torch.Size([4, 2])
    """
    from ..prewarm import _refuse_cached_decoder

    plan = as_plan(plan, example, BucketCollator, caller="compile_in_background")
    if not callable(build):
        raise ShapeBucketError(f"build must be a function () -> nn.Module, got {build!r}")
    if step is not None and not callable(step):
        raise ShapeBucketError(f"step must be a function (model, batch) -> None, got {step!r}")
    if isinstance(poll_seconds, bool) or not isinstance(poll_seconds, (int, float)):
        raise ShapeBucketError(f"poll_seconds must be a number of seconds, got {poll_seconds!r}")
    if not 0 <= poll_seconds <= 60:
        raise ShapeBucketError(f"poll_seconds must be between 0 and 60, got {poll_seconds!r}")
    options = check_options(compile_options)
    check_picklable(build=build, step=step, plan=plan, example=example)
    model = check_model(model, build)
    _refuse_cached_decoder(model, plan)
    order = order_shapes(plan, sampler)
    limit = max(compat.get_recompile_limit(), len(plan))
    raised_from = (
        compat.set_recompile_limit(limit) if limit > compat.get_recompile_limit() else None
    )
    keep = cache_dir is not None
    if cache_dir is None:
        out = tempfile.mkdtemp(prefix="shapebucket-background-")
    else:
        described = {f"{s.rows}x{s.length}": describe_batch(plan.batch(example, s)) for s in order}
        extra = f"background threads={torch.get_num_threads()} {sorted(options.items())!r}"
        out = str(Path(cache_dir) / job_key(model, step, described, extra, described=True))
        try:
            Path(out).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ShapeBucketError(
                f"cache_dir={str(cache_dir)!r} cannot hold the compiled shapes ({e.strerror}); pass a directory (created if "
                "missing) or leave cache_dir out"
            ) from None
    done = {Shape(*json.loads(p.read_text())["shape"]) for p in Path(out).glob("[0-9]*.json")}
    spec = Spec(
        build,
        plan,
        example,
        step,
        options,
        order,
        torch.get_num_threads(),
        limit,
        out,
        frozenset(done),
    )
    bg = BackgroundCompile(model, spec, float(poll_seconds), keep)
    bg.report.limit_raised_from = raised_from
    bg.poll()
    if not bg.done:
        bg._launch()
    return bg
