"""BucketTrainer and PackedTrainer inside a real transformers Trainer: epochs advance,
checkpoints carry the sampler state, a resumed run sees the same samples as an
uninterrupted one, and with torch_compile=True every shape compiles before the first step."""

from __future__ import annotations

import json
from functools import partial

import numpy as np
import pytest
import torch
from _helpers import run_scaled
from torch import nn

pytest.importorskip("transformers")
from transformers import TrainerCallback, TrainingArguments

from shapebucket import ShapeBucketError, ShapePlan, fit_packing
from shapebucket.compile import CompileCounter
from shapebucket.fit import Buckets
from shapebucket.hf import BucketTrainer, PackedTrainer, Packing
from shapebucket.hf.base import prewarm_trainer

LENGTHS = np.random.default_rng(3).integers(2, 30, 45)


class Ids(torch.utils.data.Dataset):
    def __init__(self, packed=False, idx=True):
        self.packed, self.idx = packed, idx

    def __len__(self):
        return len(LENGTHS)

    def __getitem__(self, i):
        n = int(LENGTHS[i])
        sample = {"input_ids": [i % 50] * n, "labels": [1] * n}
        if self.idx:
            sample["idx"] = i
        if not self.packed:  # a packed batch has no place for per-sample values
            sample["note"] = "unused"
        return sample


class Recorder(nn.Module):
    """A model that takes ``idx`` (so the Trainer keeps that column) and records it."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(64, 4)
        self.seen: list[list[int]] = []

    def forward(self, input_ids, labels, attention_mask, idx):
        self.seen.append(idx[attention_mask.any(1)].tolist())  # pad rows are all-False
        h = self.emb(input_ids) * attention_mask.unsqueeze(-1)
        return {"loss": h.pow(2).mean()}


class PackedRecorder(nn.Module):
    """A model that takes a packed batch (``idx`` is a list in packing order) and records it."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(64, 4)
        self.seen: list[list[int]] = []

    def forward(self, input_ids, labels, position_ids, idx=None):
        if idx is not None:
            self.seen.append(list(idx))
        h = self.emb(input_ids) * (position_ids + 1).unsqueeze(-1)
        return {"loss": h.pow(2).mean() + 0 * labels.clamp(min=0).sum()}


class StopAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_save = True
            control.should_training_stop = True


class SaveAt(TrainerCallback):
    """Saves a checkpoint after each of ``steps`` and trains on."""

    def __init__(self, *steps):
        self.steps = set(steps)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in self.steps:
            control.should_save = True


def trainer(out, seed=0, workers=0, packed=False, **kwargs):
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=4,
        num_train_epochs=2,
        seed=seed,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        dataloader_num_workers=workers,
        **(
            {"dataloader_persistent_workers": True, "dataloader_prefetch_factor": 3}
            if workers
            else {}
        ),
    )
    if packed:
        model = PackedRecorder()
        return model, PackedTrainer.from_tokens(
            64,
            model=model,
            args=args,
            train_dataset=Ids(packed=True),
            lengths=LENGTHS,
            buckets=[16, 32],
            **kwargs,
        )
    model = Recorder()
    return model, BucketTrainer(
        model=model, args=args, train_dataset=Ids(), lengths=LENGTHS, buckets=[8, 16, 32], **kwargs
    )


@pytest.mark.slow
@pytest.mark.parametrize(("workers", "packed"), [(0, False), (2, False), (0, True)])
def test_epochs_differ_and_a_resumed_run_sees_the_same_samples(tmp_path, workers, packed):
    """One uninterrupted run saves checkpoints mid-epoch 0, at the epoch's end and mid-epoch 1
    (saving does not change what it trains); a fresh trainer resumed from each sees the rest."""
    out = tmp_path / "full"
    model, t = trainer(out, workers=workers, packed=packed)
    per_epoch = len(t.sampler)
    stops = (3, per_epoch, per_epoch + 2)
    t.add_callback(SaveAt(*stops))
    loader = t.get_train_dataloader()
    assert loader.num_workers == workers
    if workers:  # the Trainer's loader options are kept
        assert loader.persistent_workers and loader.prefetch_factor == 3
    t.train()
    full = model.seen
    assert len(full) == 2 * per_epoch
    epoch0, epoch1 = full[:per_epoch], full[per_epoch:]
    assert epoch0 != epoch1  # set_epoch reached the sampler
    for epoch in (epoch0, epoch1):
        assert sorted(i for b in epoch for i in b) == list(range(len(LENGTHS)))

    for stop in stops:
        ckpt = out / f"checkpoint-{stop}"
        state = json.loads((ckpt / "shapebucket_sampler_rank0.json").read_text())
        assert (state["epoch"], state["position"]) == divmod(stop, per_epoch)
        second, t2 = trainer(tmp_path / f"resume{stop}", workers=workers, packed=packed)
        t2.train(resume_from_checkpoint=str(ckpt))
        assert full[:stop] + second.seen == full, f"resume after {stop} steps differs"


@pytest.mark.slow
def test_resume_with_another_seed_is_refused(tmp_path):
    out = tmp_path / "run"
    _, t1 = trainer(out, callbacks=[StopAt(2)])
    t1.train()
    _, t2 = trainer(out, seed=1)
    with pytest.raises(ShapeBucketError, match="trained with seed 0, this trainer has seed 1"):
        t2.train(resume_from_checkpoint=str(out / "checkpoint-2"))


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ('{"epoch": 0, "posit', "JSONDecodeError"),  # a save killed halfway
        (b"\xff\xfe{}", "UnicodeDecodeError"),
        ('{"epoch": "0", "position": 0, "seed": 0, "fingerprint": "%s"}', "state['epoch']"),
        ("[1, 2]", "got list"),
    ],
)
def test_a_damaged_sampler_state_file_is_refused_naming_the_file(tmp_path, text, shown):
    _, t = trainer(tmp_path / "run")
    ckpt = tmp_path / "run" / "checkpoint-2"
    ckpt.mkdir(parents=True)
    path = ckpt / "shapebucket_sampler_rank0.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text.replace("%s", t.sampler.state_dict()["fingerprint"]))
    with pytest.raises(ShapeBucketError) as info:
        t.train(resume_from_checkpoint=str(ckpt))
    message = str(info.value)
    assert "shapebucket_sampler_rank0.json" in message and shown in message
    assert "resume from another checkpoint, or start training afresh" in message


class Counted(TrainerCallback):
    """Graphs compiled (in ``counter``) when each step begins."""

    def __init__(self, counter):
        self.counter, self.graphs = counter, []

    def on_step_begin(self, args, state, control, **kwargs):
        self.graphs.append(self.counter.graphs)


class Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(64, 4)

    def forward(self, input_ids, labels, attention_mask):
        h = self.emb(input_ids) * attention_mask.unsqueeze(-1)
        return {"loss": h.pow(2).mean()}


def compiled(out, packed, steps=5, **kwargs):
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=4,
        max_steps=steps,
        torch_compile=True,
        torch_compile_backend="eager",  # the bookkeeping, not inductor's code
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    if packed:
        return PackedTrainer.from_tokens(
            64,
            model=PackedRecorder(),
            args=args,
            train_dataset=Ids(packed=True, idx=False),
            lengths=LENGTHS,
            buckets=[16, 32],  # two row lengths: fit_packing may need only one here
            **kwargs,
        )
    return BucketTrainer(
        model=Masked(),
        args=args,
        train_dataset=Ids(idx=False),
        lengths=LENGTHS,
        buckets=[8, 16, 32],
        **kwargs,
    )


@pytest.mark.parametrize("packed", [False, True])
def test_torch_compile_prewarms_every_shape_before_the_first_step(tmp_path, packed, fresh_compiler):
    t = compiled(tmp_path, packed)
    plan = ShapePlan.of(t.collator, t.sampler)
    with CompileCounter() as cc:
        steps = Counted(cc)
        t.add_callback(steps)
        t.train()
    report = t.prewarm_report
    assert report is not None and report.num_shapes == len(plan) >= 2
    assert steps.graphs[0] == report.total_graphs >= len(plan)  # all compiled before step 1
    assert steps.graphs == [steps.graphs[0]] * 5 and cc.graphs == steps.graphs[0]  # then none
    assert t.collator.stats.batches == 5  # the prewarm's example batch is not counted
    logged = t.state.log_history[0]
    assert logged["prewarm_shapes"] == len(plan) and logged["prewarm_seconds"] > 0
    assert report.cache_path.startswith(str(tmp_path / "compile-cache"))


def test_no_prewarm_without_torch_compile_or_when_asked(tmp_path):
    _, t = trainer(tmp_path, packed=True)
    assert t.compile_cache == str(tmp_path / "compile-cache")
    assert prewarm_trainer(t) is None and t.prewarm_report is None  # torch_compile=False
    off = compiled(tmp_path, packed=True, prewarm=False, compile_cache=False)
    assert off.compile_cache is None
    assert not any(type(c).__name__ == "PrewarmCallback" for c in off.callback_handler.callbacks)


def test_packed_trainer_refuses_what_would_mix_samples(tmp_path):
    model = PackedRecorder()
    model.config = type("Config", (), {"use_cache": True})()
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    t = PackedTrainer.from_rows([32], 2, model=model, args=args, train_dataset=Ids(packed=True))
    assert t.sampler.stats.num_samples == len(LENGTHS)  # read from the dataset's input_ids
    assert t.collator.label_shift == "model" and t.collator.mask_key is None
    model.config.use_cache = True  # after the Trainer copied args.use_cache into it
    with pytest.raises(
        ShapeBucketError, match="use_cache=True.*TrainingArguments\\(use_cache=False"
    ):
        t.train()
    fit = fit_packing(LENGTHS, tokens_per_batch=64)
    kw = {"model": model, "args": args, "train_dataset": Ids(packed=True)}
    for build, match in (
        (lambda: PackedTrainer.from_fit([32], **kw), "what fit_packing"),
        (lambda: PackedTrainer(**kw), "from_fit\\(fit, ...\\), .from_rows"),
        (lambda: PackedTrainer(fit=fit, **kw), "constructors \\(got \\['fit'\\]\\)"),
        (lambda: PackedTrainer.from_fit(fit, buckets=[32], **kw), "got \\['buckets'\\]"),
        (lambda: PackedTrainer.from_rows([32], 2, compile_cache="", **kw), "compile_cache must"),
        (lambda: PackedTrainer(packing=Packing(fit=fit, rows=2), **kw), "pass it alone"),
        (lambda: PackedTrainer(packing=Packing(), **kw), "Packing needs fit="),
        (lambda: PackedTrainer(packing=Packing(rows=2), **kw), "needs buckets="),
    ):
        with pytest.raises(ShapeBucketError, match=match):
            build()
    # checked when the Packing is made, before the Trainer is built
    for build, match in (
        (lambda: Packing(buckets=Buckets([32]), rows=0), "rows must be >= 1, got 0"),
        (lambda: Packing(buckets=Buckets([32]), rows={64: 2}), "no batch size for buckets"),
        (lambda: Packing(tokens_per_batch=-1), "tokens_per_batch must be >= 1, got -1"),
        (lambda: Packing(tokens_per_batch=1.5), "tokens_per_batch must be an int"),
    ):
        with pytest.raises(ShapeBucketError, match=match):
            build()
    t = PackedTrainer.from_fit(fit, **kw)
    assert t.packing.fit is fit and t.buckets == fit.buckets and t.sampler.rows == fit.rows
    t = PackedTrainer.from_tokens(64, **kw)  # the row lengths fitted to the lengths
    assert t.buckets == fit_packing(LENGTHS, tokens_per_batch=64).buckets


@pytest.mark.slow
def test_example_packs_prewarms_and_the_second_run_loads_the_cache(tmp_path):
    """docs/examples/hf_trainer.py --packing, twice into one output dir (inductor)."""
    import json as _json
    import os
    import sys
    from pathlib import Path

    example = Path(__file__).parent.parent / "docs" / "examples" / "hf_trainer.py"
    root = str(example.parent.parent.parent)  # this checkout's shapebucket, not an installed one
    runs = []
    for run in range(2):  # each run on its own empty inductor cache, as on a fresh machine:
        # only the cache under the output dir can make the second one warm
        inductor = str(tmp_path / f"inductor-{run}")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": root}
        env["TORCHINDUCTOR_CACHE_DIR"] = inductor
        out = run_scaled(  # 900 s on a quiet machine, scaled by the load
            [sys.executable, str(example), "4", "--packing", "--k", "1", "--out", str(tmp_path)],
            900,
            capture_output=True,
            text=True,
            env=env,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(_json.loads([x for x in out.stdout.splitlines() if x.startswith("{")][-1]))
    for r in runs:
        assert r["steps"] == 4 and r["limit_hits"] == 0
        assert r["graphs_after_prewarm"] == 0 and r["prewarm_shapes"] >= 1
    assert [r["cache_loaded"] for r in runs] == [False, True]
    assert runs[0]["train_loss"] == runs[1]["train_loss"]


@pytest.mark.parametrize("trainer", [BucketTrainer, PackedTrainer])
@pytest.mark.parametrize(
    ("lengths", "match"),
    [(5, "lengths must be a list"), ((n for n in LENGTHS), "pass list\\(lengths\\)")],
)
def test_lengths_that_are_not_a_list_are_refused(tmp_path, trainer, lengths, match):
    # a scalar or a generator was a TypeError (len() of unsized object)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    build = (
        partial(PackedTrainer.from_rows, [32], 2)
        if trainer is PackedTrainer
        else partial(BucketTrainer, buckets=[32])
    )
    with pytest.raises(ShapeBucketError, match=match):
        build(model=PackedRecorder(), args=args, train_dataset=Ids(packed=True), lengths=lengths)
