"""The background compile's other process: what runs in it (:func:`main`: build the model,
compile each shape of the plan, most frequent first, and publish each as a cache directory
``NNN-RxL`` with ``NNN-RxL.json``, its ready signal; ``error.txt`` on a failure, ``done.json``
at the end) and how the training side spawns, reads and stops it (:class:`BackgroundProcess`).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ... import _torch as compat
from ...collate.device import to_device
from ...plan.shapes import Shape, ShapePlan
from ..cache.load import MANIFEST, load_compile_cache
from ..cache.save import save_new_compile_cache
from ..calls import run_batch

__all__ = [
    "DONE",
    "ERROR",
    "BackgroundProcess",
    "Look",
    "Published",
    "Spec",
    "compile_shapes",
    "compiled_forward",
    "main",
    "published_shapes",
    "yield_to_training",
]

ERROR = "error.txt"
DONE = "done.json"
_INDUCTOR_DIR = "TORCHINDUCTOR_CACHE_DIR"


@dataclass(frozen=True)
class Spec:
    """Everything the background process needs; it must pickle (it crosses a spawn)."""

    build: Callable[[], torch.nn.Module]
    plan: ShapePlan
    example: Any
    step: Callable[[torch.nn.Module, Any], Any] | None
    compile_options: Mapping[str, Any]
    order: tuple[Shape, ...]
    threads: int
    limit: int
    out: str
    skip: frozenset[Shape] = field(default_factory=frozenset)


def compiled_forward(model: torch.nn.Module, options: Mapping[str, Any]) -> Callable[..., Any]:
    """``torch.compile(type(model).forward, dynamic=False, **options)``: the same function in
    both processes, so the training process traces the graph the background compiled."""
    return torch.compile(type(model).forward, dynamic=False, **options)  # type: ignore[no-any-return]


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.rename(path)


def compile_shapes(spec: Spec) -> None:
    """Build the model and compile every shape of ``spec.order``, publishing each to
    ``spec.out`` as soon as it is compiled. Runs in the background process (or, for
    tests, in this one)."""
    out = Path(spec.out)
    start = time.perf_counter()
    model = spec.build()
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"build() returned a {type(model).__name__}, not a torch.nn.Module")
    params = list(model.parameters())
    device = params[0].device if params else torch.device("cpu")
    fn = compiled_forward(model, spec.compile_options)
    model.forward = lambda *a, **k: fn(model, *a, **k)  # type: ignore[method-assign]
    with compat.raised_recompile_limit(spec.limit):
        _settle(spec, model, device)
        _compile_each(spec, model, device)
    _atomic_write(out / DONE, json.dumps({"seconds": time.perf_counter() - start}))


def _run(spec: Spec, model: torch.nn.Module, batch: Any) -> None:
    if spec.step is not None:
        spec.step(model, batch)
    else:
        run_batch(model, None, batch, "compile_in_background")
    model.zero_grad(set_to_none=True)


def _settle(spec: Spec, model: torch.nn.Module, device: torch.device) -> None:
    """One eager run of the first shape before anything compiles, as prewarm's ``_settle``."""
    shape = spec.order[0]
    with torch.compiler.set_stance("force_eager"):
        _run(spec, model, to_device(spec.plan.batch(spec.example, shape), device))


def _compile_each(spec: Spec, model: torch.nn.Module, device: torch.device) -> None:
    """Compile and publish each shape of ``spec.order`` not in ``spec.skip``."""
    out = Path(spec.out)
    exported: set[str] = set()
    for i, shape in enumerate(spec.order):
        if shape in spec.skip:
            continue
        t0 = time.perf_counter()
        batch = to_device(spec.plan.batch(spec.example, shape), device)
        graphs = compat.unique_graphs()
        _run(spec, model, batch)
        seconds = time.perf_counter() - t0
        name = f"{i:03d}-{shape.rows}x{shape.length}"
        sizes = save_new_compile_cache(out / name, exported)
        info = {"shape": list(shape), "seconds": seconds, "graphs": compat.unique_graphs() - graphs}
        _atomic_write(out / f"{name}.json", json.dumps({**info, **sizes}))


def main(spec: Spec) -> None:
    """The background process's entry point (``multiprocessing`` spawns it, pinned to one
    core: :func:`yield_to_training`). Its inductor cache is private; it runs the training
    process's thread count (a CPU kernel's FX-graph cache key includes it) with one compile
    worker."""
    try:
        torch.set_num_threads(spec.threads)
        compat.set_compile_threads(1)
        compile_shapes(spec)
    except BaseException:
        _atomic_write(Path(spec.out) / ERROR, traceback.format_exc())
        raise


def yield_to_training(pid: int, nice: int) -> None:
    """Pin the background process to one core and give it the niceness ``nice`` from its
    start (its own imports included): at 10, the training process keeps the CPU it had."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    try:
        if cores:
            os.sched_setaffinity(pid, {cores[-1]})
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    except (OSError, AttributeError):  # not Linux, or not permitted: it runs unpinned
        pass


def published_shapes(out: str) -> frozenset[Shape]:
    """The shapes an earlier run published into ``out`` (a kept ``cache_dir``)."""
    return frozenset(
        Shape(*json.loads(p.read_text())["shape"]) for p in Path(out).glob("[0-9]*.json")
    )


@dataclass(frozen=True)
class Published:
    """A shape the background published: its compile seconds, and whether its cache
    loaded into this process (a damaged one did not: load_compile_cache warned)."""

    shape: Shape
    seconds: float
    loaded: bool


@dataclass
class Look:
    """What one look at the output directory found: the shapes published since the last
    look, the background's error (the first look that finds it), whether it wrote that it
    is done, and whether the process had ended before the directory was read."""

    published: list[Published] = field(default_factory=list)
    error: str | None = None
    done: bool = False
    ended: bool = False


class BackgroundProcess:
    """The spawned compile process and the directory ``out`` it publishes into (kept after
    :meth:`stop` when ``keep``)."""

    def __init__(self, out: Path, keep: bool) -> None:
        self.out = out
        self.keep = keep
        self.process: Any = None  # a multiprocessing.Process once started
        self.seen: set[str] = set()

    def start(self, spec: Spec, nice: int) -> None:
        """Spawn the background process, pinned to one core at niceness ``nice``."""
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        old = os.environ.get(_INDUCTOR_DIR)
        os.environ[_INDUCTOR_DIR] = str(self.out / ".inductor")  # the child's, restored at once
        try:
            self.process = ctx.Process(target=main, args=(spec,), daemon=True)
            self.process.start()
            yield_to_training(self.process.pid, nice)
        finally:
            if old is None:
                os.environ.pop(_INDUCTOR_DIR, None)
            else:
                os.environ[_INDUCTOR_DIR] = old

    @property
    def exitcode(self) -> int | None:
        return None if self.process is None else self.process.exitcode

    def look(self) -> Look:
        """The shapes published since the last look (their caches loaded), and the rest
        of what the directory and the process say."""
        # read before the listing: a process that wrote done.json and then exited is not ended early
        look = Look(ended=self.process is not None and not self.process.is_alive())
        try:
            names = sorted(os.listdir(self.out))
        except FileNotFoundError:
            names = []
        for name in names:
            if not name.endswith(".json") or name == DONE or name in self.seen:
                continue
            self.seen.add(name)
            info = json.loads((self.out / name).read_text())
            loaded = _load(self.out / name[: -len(".json")])
            look.published.append(Published(Shape(*info["shape"]), float(info["seconds"]), loaded))
        if ERROR in names and ERROR not in self.seen:
            self.seen.add(ERROR)
            look.error = (self.out / ERROR).read_text()
        look.done = DONE in names
        return look

    def stop(self) -> None:
        """Stop the process (if running) and remove its files unless they are kept."""
        if self.process is not None and self.process.is_alive():
            self.process.terminate()
            self.process.join(10)
        if not self.keep:
            shutil.rmtree(self.out, ignore_errors=True)


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
