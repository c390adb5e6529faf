"""BucketTrainer inside a real transformers Trainer: epochs advance, checkpoints carry
the sampler state, a resumed run sees the same samples as an uninterrupted one."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("transformers")
from transformers import TrainerCallback, TrainingArguments

from shapebucket import ShapeBucketError
from shapebucket.hf import BucketTrainer

LENGTHS = np.random.default_rng(3).integers(2, 30, 45)


class Ids(torch.utils.data.Dataset):
    def __len__(self):
        return len(LENGTHS)

    def __getitem__(self, i):
        n = int(LENGTHS[i])
        return {"input_ids": [i % 50] * n, "labels": [1] * n, "idx": i, "note": "unused"}


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


class StopAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_save = True
            control.should_training_stop = True


def trainer(out, seed=0, workers=0, **kwargs):
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
    model = Recorder()
    return model, BucketTrainer(
        model=model, args=args, train_dataset=Ids(), lengths=LENGTHS, buckets=[8, 16, 32], **kwargs
    )


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_epochs_differ_and_a_resumed_run_sees_the_same_samples(tmp_path, workers):
    model, t = trainer(tmp_path / "full", workers=workers)
    loader = t.get_train_dataloader()
    assert loader.num_workers == workers
    if workers:  # the Trainer's loader options are kept
        assert loader.persistent_workers and loader.prefetch_factor == 3
    t.train()
    per_epoch = len(t.bucket_sampler)
    full = model.seen
    assert len(full) == 2 * per_epoch
    epoch0, epoch1 = full[:per_epoch], full[per_epoch:]
    assert epoch0 != epoch1  # set_epoch reached the sampler
    for epoch in (epoch0, epoch1):
        assert sorted(i for b in epoch for i in b) == list(range(len(LENGTHS)))

    for stop in (3, per_epoch, per_epoch + 2):
        out = tmp_path / f"stop{stop}"
        first, t1 = trainer(out, workers=workers, callbacks=[StopAt(stop)])
        t1.train()
        ckpt = out / f"checkpoint-{stop}"
        state = json.loads((ckpt / "shapebucket_sampler_rank0.json").read_text())
        assert (state["epoch"], state["position"]) == divmod(stop, per_epoch)
        second, t2 = trainer(out, workers=workers)
        t2.train(resume_from_checkpoint=str(ckpt))
        assert first.seen + second.seen == full, f"resume after {stop} steps differs"


@pytest.mark.slow
def test_resume_with_another_seed_is_refused(tmp_path):
    out = tmp_path / "run"
    _, t1 = trainer(out, callbacks=[StopAt(2)])
    t1.train()
    _, t2 = trainer(out, seed=1)
    with pytest.raises(ShapeBucketError, match="trained with seed 0, this trainer has seed 1"):
        t2.train(resume_from_checkpoint=str(out / "checkpoint-2"))
