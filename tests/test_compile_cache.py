"""The compile cache: saved atomically (issue 22 item 4), every manifest field checked
(item 7), and job keys that tell classes without source apart (low item). No compile:
the caches are made of made-up inductor files."""

from __future__ import annotations

import json
import threading
import warnings
from pathlib import Path

import pytest
import torch

from shapebucket import ShapeBucketError
from shapebucket import _torch as compat
from shapebucket.compile import load_compile_cache, save_compile_cache
from shapebucket.compile.cache import save as cache_module
from shapebucket.compile.cache.key import job_key
from shapebucket.compile.cache.load import sha256

ARTIFACTS = b"compiler artifacts " * 20


@pytest.fixture(autouse=True)
def fake_artifacts(monkeypatch):
    """The compiler's artifacts, made up: saved as ARTIFACTS, loaded only when intact."""
    monkeypatch.setattr(compat, "save_cache_artifacts", lambda: ARTIFACTS)
    monkeypatch.setattr(compat, "load_cache_artifacts", lambda data: data == ARTIFACTS)


def make_live(root, extra=0):
    live = root / "live"
    (live / "ab").mkdir(parents=True, exist_ok=True)
    (live / "ab" / "kernel.py").write_text("x = 1\n" * 100)
    (live / "graph.bin").write_bytes(bytes(range(256)) * 8)
    for i in range(extra):
        (live / f"new{i}.bin").write_bytes(bytes([i]) * 300)
    return live


def contents(directory):
    return {
        f.relative_to(directory).as_posix(): f.read_bytes()
        for f in sorted(directory.rglob("*"))
        if f.is_file()
    }


def loads_cleanly(cache):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a refusal warns: make it fail here
        return load_compile_cache(cache)


class Interrupt(BaseException):
    pass


def interrupt_at(monkeypatch, k):
    """Make the k-th file a save writes half-written, then interrupt the save."""
    calls = [0]
    real_copy, real_write = cache_module._copy_file, cache_module._write_bytes

    def tick(dst, data):
        calls[0] += 1
        if calls[0] == k:
            Path(dst).write_bytes(data[: len(data) // 2])
            raise Interrupt(f"interrupted at file {k}")

    def copy(src, dst):
        tick(dst, Path(src).read_bytes())
        real_copy(src, dst)

    def write(dst, data):
        tick(dst, data)
        real_write(dst, data)

    monkeypatch.setattr(cache_module, "_copy_file", copy)
    monkeypatch.setattr(cache_module, "_write_bytes", write)
    return calls


def test_an_interrupted_save_leaves_the_previous_cache_at_each_file(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    with compat.fresh_inductor_cache(str(make_live(tmp_path))):
        save_compile_cache(cache)
    previous = contents(cache)
    live = make_live(tmp_path, extra=2)  # the next run compiled two more kernels
    with monkeypatch.context() as m:
        total = interrupt_at(m, 0)
        with compat.fresh_inductor_cache(str(live)):
            save_compile_cache(tmp_path / "count")
        writes = total[0]
    assert writes == 6  # artifacts, 4 inductor files, the manifest
    for k in range(1, writes + 1):
        with monkeypatch.context() as m:
            interrupt_at(m, k)
            with compat.fresh_inductor_cache(str(live)), pytest.raises(Interrupt):
                save_compile_cache(cache)
        assert contents(cache) == previous, f"interrupted at file {k}"
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left
        with compat.fresh_inductor_cache(str(tmp_path / "targets" / str(k))):
            assert loads_cleanly(cache)
    with compat.fresh_inductor_cache(str(live)):
        save_compile_cache(cache)  # the next full save is complete and certified
    saved = contents(cache / "inductor")
    assert saved == contents(live) and loads_cleanly(cache)


def test_an_interrupted_first_save_leaves_no_cache(tmp_path, monkeypatch):
    live = make_live(tmp_path)
    for k in (1, 3, 4):
        with monkeypatch.context() as m:
            interrupt_at(m, k)
            with compat.fresh_inductor_cache(str(live)), pytest.raises(Interrupt):
                save_compile_cache(tmp_path / "cache")
        assert not (tmp_path / "cache").exists() and loads_cleanly(tmp_path / "cache") is False


def test_a_save_keeps_the_kernels_of_the_cache_it_replaces(tmp_path):
    cache = tmp_path / "cache"
    with compat.fresh_inductor_cache(str(make_live(tmp_path / "a"))):
        save_compile_cache(cache)
    other = tmp_path / "b" / "live"
    other.mkdir(parents=True)
    (other / "other.bin").write_bytes(b"other kernel")
    with compat.fresh_inductor_cache(str(other)):
        save_compile_cache(cache)
    assert set(contents(cache / "inductor")) == {"ab/kernel.py", "graph.bin", "other.bin"}


def test_a_save_leaves_out_inductors_precompiled_headers(tmp_path):
    """CI ran out of disk: each save copied the machine's precompiled C++ headers (3.6 GB,
    built for one compiler, read by no cached kernel) into the cache it wrote."""
    live = make_live(tmp_path / "a")
    (live / "precompiled_headers").mkdir()
    (live / "precompiled_headers" / "c3bf.h.gch").write_bytes(b"header" * 100)
    cache = tmp_path / "cache"
    with compat.fresh_inductor_cache(str(live)):
        save_compile_cache(cache)
    assert set(contents(cache / "inductor")) == {"ab/kernel.py", "graph.bin"}
    assert loads_cleanly(cache)


def manifest_edit(edit):
    def damage(cache):
        manifest = json.loads((cache / "manifest.json").read_text())
        edit(manifest)
        (cache / "manifest.json").write_text(json.dumps(manifest))

    return damage


def first(manifest):
    return next(iter(manifest["files"]))


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (manifest_edit(lambda m: m.update(files=list(m["files"]))), "no 'files' mapping"),
        (manifest_edit(lambda m: m["files"][first(m)].pop("bytes")), "malformed"),
        (manifest_edit(lambda m: m["files"].update({first(m): "abc"})), "malformed"),
        (manifest_edit(lambda m: m["files"][first(m)].update(bytes="12")), "malformed"),
        (manifest_edit(lambda m: m["files"][first(m)].update(sha256=None)), "malformed"),
        (manifest_edit(lambda m: m.pop("torch")), "saved by torch None"),
        (manifest_edit(lambda m: m["files"].update({"../x": m["files"][first(m)]})), "outside"),
        (lambda c: (c / "manifest.json").write_text("[1, 2]"), "no 'files' mapping"),
        (lambda c: (c / "inductor" / "extra.py").write_text("import os\n"), "not in its manifest"),
    ],
)
def test_a_malformed_manifest_or_an_added_file_is_refused(tmp_path, damage, needle):
    with compat.fresh_inductor_cache(str(make_live(tmp_path))):
        save_compile_cache(tmp_path / "cache")
    damage(tmp_path / "cache")
    target = tmp_path / "target"
    with compat.fresh_inductor_cache(str(target)), pytest.warns(UserWarning, match=needle):
        assert load_compile_cache(tmp_path / "cache") is False
    assert not target.exists() or not any(target.rglob("*.bin"))


def test_corrupt_artifacts_with_a_matching_manifest_are_not_loaded(tmp_path):
    """The manifest is rewritten to match: only the compiler can tell the bytes are bad."""
    cache = tmp_path / "cache"
    with compat.fresh_inductor_cache(str(make_live(tmp_path))):
        save_compile_cache(cache)
    (cache / "artifacts.bin").write_bytes(b"garbage")
    manifest = json.loads((cache / "manifest.json").read_text())
    manifest["files"]["artifacts.bin"] = {
        "bytes": 7,
        "sha256": sha256(cache / "artifacts.bin"),
    }
    (cache / "manifest.json").write_text(json.dumps(manifest))
    with pytest.warns(UserWarning, match="could not read artifacts.bin"):
        assert load_compile_cache(cache) is False


def test_compat_reports_unreadable_artifacts(monkeypatch):
    monkeypatch.undo()  # the real compiler functions
    assert compat.load_cache_artifacts(b"garbage") is False


def classes_from_source(body):
    scope: dict = {}
    exec(body, {"torch": torch}, scope)  # as a notebook defines them: no source file
    return scope["Net"]


def test_job_key_tells_classes_without_source_apart():
    double = classes_from_source(
        "class Net(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n"
    )
    triple = classes_from_source(
        "class Net(torch.nn.Module):\n    def forward(self, x):\n        return x * 3\n"
    )
    again = classes_from_source(
        "class Net(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n"
    )
    batches = {8: torch.ones(2, 8)}
    assert job_key(double(), None, batches) != job_key(triple(), None, batches)
    assert job_key(double(), None, batches) == job_key(again(), None, batches)
    step_a = classes_from_source("def Net(b):\n    return b + 1\n")
    step_b = classes_from_source("def Net(b):\n    return b + 2\n")
    assert job_key(None, step_a, batches) != job_key(None, step_b, batches)


def test_a_file_in_the_way_of_the_cache_is_refused_and_kept(tmp_path):
    """Issue 39 item 11: a file at the cache's path (a mistyped "model.pt") was deleted."""
    cache = tmp_path / "model.pt"
    cache.write_bytes(b"weights")
    with (
        compat.fresh_inductor_cache(str(make_live(tmp_path))),
        pytest.raises(ShapeBucketError, match=r"'.*model\.pt' is a file, not a cache.*never"),
    ):
        save_compile_cache(cache)
    assert cache.read_bytes() == b"weights"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["live", "model.pt"]  # nothing aside


def test_a_directory_holding_more_than_a_cache_is_refused_and_kept(tmp_path):
    """A directory with files no cache has (a checkpoint directory) is never replaced; a
    cache whose manifest is damaged, another torch's, or an empty directory is."""
    with compat.fresh_inductor_cache(str(make_live(tmp_path))):
        for name, files in [("run", {"model.pt": b"w"}), ("run2", {"inductor": b"not a dir"})]:
            other = tmp_path / name
            other.mkdir()
            for f, data in files.items():
                (other / f).write_bytes(data)
            with pytest.raises(ShapeBucketError, match=f"holds 1 entry no cache has \\({f}\\)"):
                save_compile_cache(other)
            assert contents(other) == files
        cache = tmp_path / "cache"
        save_compile_cache(cache, {"aot.bin": b"functions"})
        (cache / "stray.txt").write_text("mine")
        with pytest.raises(ShapeBucketError, match=r"stray\.txt"):
            save_compile_cache(cache)
        assert (cache / "stray.txt").read_text() == "mine"
        (cache / "stray.txt").unlink()
        (cache / "manifest.json").write_text(
            (cache / "manifest.json").read_text().replace(torch.__version__, "1.0.0")
        )
        save_compile_cache(cache)  # another torch's cache, its extra file kept by name
        (cache / "manifest.json").write_text("[1, 2]")
        (cache / "inductor" / "added.py").write_text("x = 2\n")
        save_compile_cache(cache)  # a damaged cache is still a cache
        assert loads_cleanly(cache)
        (tmp_path / "empty").mkdir()
        save_compile_cache(tmp_path / "empty")
        assert loads_cleanly(tmp_path / "empty")


def test_two_saves_racing_on_one_cache_take_turns(tmp_path, monkeypatch):
    """Issue 39 item 11: save_compile_cache took no lock; a save that moved the cache aside
    while another copied from it made the other fail with a raw shutil.Error. Here the
    first save pauses while copying the cache's files until the second one has moved the
    cache aside, which then waits for the first to finish (each pause at most 1 s: with
    the lock, the second save only starts once the first is done)."""
    cache = tmp_path / "cache"
    with compat.fresh_inductor_cache(str(make_live(tmp_path))):
        save_compile_cache(cache)
        aside, first_done = threading.Event(), threading.Event()
        real_copy, real_rename = cache_module._copy_file, Path.rename

        def slow_copy(src, dst):
            if threading.current_thread().name == "first" and str(cache) in src:
                aside.wait(1.0)
            real_copy(src, dst)

        def slow_rename(self, target):
            moved = real_rename(self, target)
            if threading.current_thread().name == "second" and self == cache:
                aside.set()
                first_done.wait(1.0)
            return moved

        monkeypatch.setattr(cache_module, "_copy_file", slow_copy)
        monkeypatch.setattr(Path, "rename", slow_rename)
        errors: list[BaseException] = []

        def save(done=None):
            try:
                save_compile_cache(cache)
            except BaseException as e:
                errors.append(e)
            finally:
                if done is not None:
                    done.set()

        first = threading.Thread(target=save, args=(first_done,), name="first")
        second = threading.Thread(target=save, name="second")
        first.start()
        second.start()
        first.join(30.0)
        second.join(30.0)
    assert errors == []
    assert loads_cleanly(cache)


def test_extra_files_are_checked_by_the_manifest_and_kept_by_the_next_save(tmp_path):
    cache = tmp_path / "cache"
    with compat.fresh_inductor_cache(str(make_live(tmp_path))):
        save_compile_cache(cache, {"aot.bin": b"functions" * 50})
        assert (cache / "aot.bin").read_bytes() == b"functions" * 50
        assert "aot.bin" in json.loads((cache / "manifest.json").read_text())["files"]
        save_compile_cache(cache)  # a save that names no extra file keeps the cache's own
        assert (cache / "aot.bin").read_bytes() == b"functions" * 50
        save_compile_cache(cache, {"aot.bin": b"newer"})  # one that names it replaces it
        assert (cache / "aot.bin").read_bytes() == b"newer"
        assert load_compile_cache(cache) is True
    (cache / "aot.bin").write_bytes(b"other")  # same size, another checksum
    with pytest.warns(UserWarning, match="checksum"):
        assert load_compile_cache(cache) is False
    for bad in ("", "a/b", "..", ".x", "MANIFEST.JSON", "inductor", "a\x00b", "x" * 101, 5):
        with pytest.raises(ShapeBucketError, match="must be one plain name"):
            save_compile_cache(tmp_path / "bad", {bad: b"x"})
    for bad_value in ("text", None, 5):
        with pytest.raises(ShapeBucketError, match=r"extra\['a.bin'\] must be bytes"):
            save_compile_cache(tmp_path / "bad", {"a.bin": bad_value})
    for not_a_mapping in ("abc", {"a.bin"}, 5):
        with pytest.raises(ShapeBucketError, match="must map file names to bytes"):
            save_compile_cache(tmp_path / "bad", not_a_mapping)
    assert not (tmp_path / "bad").exists()  # refused before anything was written


def test_job_key_tells_parameter_shapes_and_dtypes_apart():
    """Issue 39 item 15: a width-8 model got the width-16 model's key (same class, same
    code), so a cache compiled for one was loaded for the other."""
    batches = {8: torch.ones(2, 8)}
    narrow, wide = torch.nn.Linear(8, 8), torch.nn.Linear(8, 16)
    assert job_key(narrow, None, batches) != job_key(wide, None, batches)
    assert job_key(narrow, None, batches) == job_key(torch.nn.Linear(8, 8), None, batches)
    assert job_key(narrow, None, batches) != job_key(narrow.to(torch.float64), None, batches)
    frozen = torch.nn.Linear(8, 8).requires_grad_(False)
    assert job_key(frozen, None, batches) != job_key(torch.nn.Linear(8, 8), None, batches)
    normed = [torch.nn.BatchNorm1d(n) for n in (8, 16)]  # buffers too
    assert job_key(normed[0], None, batches) != job_key(normed[1], None, batches)


def leftovers(root):
    return sorted(p.name for p in root.iterdir() if ".saving-" in p.name or ".old-" in p.name)


def test_what_a_killed_save_left_is_removed_by_the_next_save(tmp_path):
    """Issue 39 item 15: a save killed mid-way left `.<key>.saving-*` (and, killed between
    its two renames, `.<key>.old-*`) for good. The next save of that path removes them
    while it holds the lock; another cache's leftovers stay."""
    cache = tmp_path / "cache"
    killed = [tmp_path / ".cache.saving-ab12cd_9", tmp_path / ".cache.old-4242-zz99yy00"]
    others = [tmp_path / ".cache2.saving-ab12cd_9", tmp_path / ".cache.saving-x"]
    for d in killed + others:
        (d / "inductor").mkdir(parents=True)
        (d / "inductor" / "k.py").write_text("half")
    with compat.fresh_inductor_cache(str(make_live(tmp_path))):
        save_compile_cache(cache)
    assert leftovers(tmp_path) == sorted(d.name for d in others)
    assert loads_cleanly(cache)


def test_a_save_without_the_lock_removes_only_old_leftovers(tmp_path, monkeypatch):
    """Without the lock (Windows) another
    process may be writing a `.saving-*` right now: only one untouched for STALE_S goes."""
    import os
    import time

    monkeypatch.setattr(cache_module, "LOCKS", False)
    fresh, stale = tmp_path / ".cache.saving-fresh000", tmp_path / ".cache.saving-stale000"
    for d in (fresh, stale):
        d.mkdir()
    old = time.time() - cache_module.STALE_S - 60
    os.utime(stale, (old, old))
    with compat.fresh_inductor_cache(str(make_live(tmp_path))):
        save_compile_cache(tmp_path / "cache")
    assert leftovers(tmp_path) == [fresh.name]
