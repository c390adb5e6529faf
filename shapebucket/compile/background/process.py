"""The background process seen from the training side: spawn it, read what it published
since the last look, stop it and remove its files.

The handle (:mod:`.handle`) asks :meth:`BackgroundProcess.look` at each poll and turns
the answer into its switches and its report; this module knows the directory layout
the worker (:mod:`.worker`) writes and how the process is started and ended.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...plan.shapes import Shape
from ..cache.load import MANIFEST, load_compile_cache
from .setup import yield_to_training
from .worker import DONE, ERROR, Spec, main

__all__ = ["BackgroundProcess", "Look", "Published"]


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
        env = {"TORCHINDUCTOR_CACHE_DIR": str(self.out / ".inductor")}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # read by the child at its start, restored at once
        try:
            self.process = ctx.Process(target=main, args=(spec,), daemon=True)
            self.process.start()
            yield_to_training(self.process.pid, nice)
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

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
