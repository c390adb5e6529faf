import importlib.util
import json
import re

import numpy as np
import pytest
import torch
from _helpers import bench
from hypothesis import given, settings
from hypothesis import strategies as st

from shapebucket import BucketCollator
from shapebucket import _torch as compat
from shapebucket.bench import batching, cli, harness
from shapebucket.bench.peers import (
    FixedLengthCollator,
    fixed_length_packs,
    grouped_indices_reference,
    length_grouped_indices,
    mega_batch_mult,
)
from shapebucket.bench.report import check_losses, format_table, headline
from shapebucket.bench.runner import fresh_forward
from shapebucket.bench.strategies import DEFAULT, PEERS, StrategyResult
from shapebucket.bench.workloads import caption_lengths, load_workload, stdlib_docstring_lengths
from shapebucket.compile import CompileCounter

REQUIRED = {
    "name",
    "peer",
    "useful_tokens_per_sec",
    "tokens_per_sec_min",
    "tokens_per_sec_max",
    "round_tokens_per_sec",
    "steps_per_sec",
    "warmup_s",
    "job_s",
    "job10_s",
    "epoch_s",
    "peak_mem_mb",
    "graphs",
    "timed_recompiles",
    "token_efficiency",
    "step_times",
    "losses",
}


@pytest.mark.slow
def test_quick_run_writes_table_json_and_plot(tmp_path):
    # 2,000 samples and 100 a timed epoch (quick: 20,000 and 400): the same strategies,
    # rounds and assertions, a quarter of the timed steps
    out = bench(
        "--quick",
        "--samples",
        "2000",
        "--epoch-samples",
        "100",
        "--cache",
        "shared",
        "--json",
        str(tmp_path / "r.json"),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["config"]["torch"] and data["config"]["batch_size"] == 16
    results = {r["name"]: r for r in data["results"]}
    assert list(results) == [*DEFAULT, "limit"]  # the physical limit: a reference row, last
    limit = results.pop("limit")
    assert limit["error"] is None and limit["useful_tokens_per_sec"] > 0 and not limit["peer"]
    assert all(r["of_limit"] > 0 for r in results.values())
    assert "limit (reference)" in out.stdout and "of the limit" in out.stdout
    timed = data["config"]["timed_real_tokens"]
    for r in results.values():
        assert r["error"] is None, r
        assert r.keys() >= REQUIRED
        assert len(r["round_tokens_per_sec"]) == 2 and len(r["step_times"]) % 2 == 0
        assert r["tokens_per_sec_min"] <= r["useful_tokens_per_sec"] <= r["tokens_per_sec_max"]
        assert r["job10_s"] > r["job_s"] > r["warmup_s"] and 0 < r["token_efficiency"] <= 1
        assert r["peak_mem_mb"] > 0
        # every round trains every sample of the timed set once (the losses: warm-up + rounds)
        assert len(r["losses"]) == data["config"]["warmup_steps"] + len(r["step_times"])
    assert timed == data["config"]["timed_real_tokens"] > 0
    assert results["shapebucket-packed"]["timed_recompiles"] == 0
    assert results["fixed-packed-compile"]["graphs"] == 1  # one shape, one graph
    assert results["grouped-eager"]["graphs"] == 0
    head = data["headline"]
    assert head["ours"].startswith("shapebucket") and head["peer"] in PEERS and head["ratio"] > 0
    assert len(head["ratio_rounds"]) == 2 and head["ceiling"] > 1
    for needle in ("headline:", "one epoch", "ten epochs", "ceiling:", "loss checks:"):
        assert needle in out.stdout
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"  # next to the JSON


@pytest.mark.slow
def test_captioning_images_go_through_the_collator(tmp_path):
    out = bench(
        "--quick",
        "--workload",
        "captioning",
        "--strategies",
        "grouped-eager,shapebucket",
        "--rounds",
        "1",
        "--epoch-samples",
        "64",
        "--cache",
        "shared",
        "--json",
        str(tmp_path / "c.json"),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["config"]["model"]["image"] == 32
    strategies = [r for r in data["results"] if r["name"] != "limit"]
    assert strategies and all(r["error"] is None for r in strategies)
    (limit,) = [r for r in data["results"] if r["name"] == "limit"]  # a GPT-only reference
    assert limit["error"] == "skipped: the limit runs the GPT"


def quick_args(*extra):
    args = cli._parser().parse_args(["--quick", "--samples", "2000", *extra])
    cli._resolve(args)
    return args


def test_quick_run_writes_to_its_own_paths():
    args = quick_args()
    assert args.json == "results/steps_per_sec_mixture_quick.json"
    assert args.plot == "results/steps_per_sec_mixture_quick.png"
    full = cli._parser().parse_args(["--workload", "text"])
    cli._resolve(full)
    assert full.json == "results/steps_per_sec_text.json"


def test_padding_invariance_check_fails_when_a_mask_is_broken(monkeypatch, capsys):
    s = harness._setup(quick_args())
    assert harness.check_padding_invariance(s) == []
    real = batching._collator

    def broken(buckets, rows=None):
        if rows is not None:  # shapebucket's: pad tokens count in the loss and are attended to
            return BucketCollator(buckets, pad_values={"labels": 0}, mask_key=None, rows=rows)
        return real(buckets, rows)

    monkeypatch.setattr(batching, "_collator", broken)
    problems = harness.check_padding_invariance(harness._setup(quick_args()))
    assert problems and "padding leaks into the loss" in problems[0]
    # and the command fails with it, even when it times only an eager peer
    status = cli.main(
        [
            "--quick",
            "--samples",
            "2000",
            "--strategies",
            "grouped-eager",
            "--no-limit",
            "--rounds",
            "1",
            "--epoch-samples",
            "32",
            "--json",
            "",
        ]
    )
    assert status == 1 and "padded two ways give different losses" in capsys.readouterr().err


def test_fresh_forward_gives_each_strategy_its_own_graphs():
    compat.reset_compiler()
    a = torch.compile(fresh_forward("a"), backend="eager", dynamic=False)
    b = torch.compile(fresh_forward("b"), backend="eager", dynamic=False)
    model = torch.nn.Linear(4, 2)
    with CompileCounter() as cc:
        a(model, {"input": torch.ones(3, 4)})
        b(model, {"input": torch.ones(3, 4)})  # the same shape: b still compiles its own graph
    assert cc.graphs == 2 and cc.recompiles == []


def test_compile_events_grow_when_the_compiler_works_and_only_then(fresh_compiler):
    """time_round flags a step as compiling by them: a recompile counts, a cached call not."""
    f = torch.compile(fresh_forward("events"), backend="eager", dynamic=False)
    model = torch.nn.Linear(4, 2)
    seen = []
    for rows in (3, 3, 5, 5):
        before = compat.compile_events()
        f(model, {"input": torch.ones(rows, 4)})
        seen.append(compat.compile_events() > before)
    assert seen == [True, False, True, False]


def test_every_family_times_the_same_samples_once_per_round():
    args = quick_args("--epoch-samples", "300", "--strategies", "all")
    s = harness._setup(args)
    assert len(s.timed_ids) == 300
    for family in ("grouped", "fixed", "buckets", "tokens", "packed"):
        timed = batching.epoch_batches(family, s, s.timed_ids)
        seen = np.sort(np.concatenate(timed.epoch))
        assert np.array_equal(seen, s.timed_ids), family  # each sample once, no other
    fam = batching.build_family("fixed", s)
    assert sum(fam.timed_real) == int(s.lengths[s.timed_ids].sum())
    assert {tuple(b["input_ids"].shape) for b in fam.timed} == {(fam.collate.rows, args.max_len)}


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 64), min_size=1, max_size=2500),
    rows=st.integers(1, 8),
    packer=st.sampled_from(["bfd", "next-fit"]),
)
def test_fixed_length_packs_hold_every_sample_once_within_the_row(lengths, rows, packer):
    L = np.asarray(lengths)
    packs = fixed_length_packs(L, 64, rows, seed=0, packer=packer)
    flat = [i for b in packs for r in b for i in r]
    assert sorted(flat) == list(range(len(L)))
    assert all(0 < len(b) <= rows for b in packs) and all(len(b) == rows for b in packs[:-1])
    assert all(0 < L[r].sum() <= 64 for b in packs for r in b)
    if packer == "bfd" and len(L) <= 1000:  # one chunk: no two of its rows fit in one row
        fills = sorted(int(L[r].sum()) for b in packs for r in b)
        assert len(fills) < 2 or fills[0] + fills[1] > 64


def test_fixed_length_collator_lays_the_packers_rows():
    samples = [
        {"input_ids": torch.arange(n) + 1, "labels": torch.arange(n) + 2} for n in (3, 2, 4, 1)
    ]
    b = FixedLengthCollator(length=5, rows=3)(samples, [2, 2])
    assert b["document_ids"].tolist() == [[0, 0, 0, 1, 1], [0, 0, 0, 0, 1], [-1] * 5]
    assert b["position_ids"][0].tolist() == [0, 1, 2, 0, 1]
    assert b["labels"][2].tolist() == [-100] * 5 and b["input_ids"][1].tolist() == [1, 2, 3, 4, 1]
    with pytest.raises(ValueError, match="rows"):
        FixedLengthCollator(length=5, rows=1)(samples, [2, 2])


@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="needs the hf extra (transformers)"
)
@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 300), min_size=1, max_size=3000),
    batch_size=st.integers(1, 64),
    seed=st.integers(0, 2**31),
)
def test_grouped_reference_matches_transformers(lengths, batch_size, seed):
    from transformers.trainer_pt_utils import LengthGroupedSampler

    real = list(
        LengthGroupedSampler(
            batch_size, lengths=lengths, generator=torch.Generator().manual_seed(seed)
        )
    )
    ours = grouped_indices_reference(lengths, batch_size, torch.Generator().manual_seed(seed))
    assert ours == real
    assert length_grouped_indices(np.array(lengths), batch_size, seed=seed).tolist() == real


@settings(max_examples=15, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 300), min_size=1, max_size=3000),
    batch_size=st.integers(1, 64),
    dataset_size=st.integers(1, 400_000),
    seed=st.integers(0, 2**31),
)
def test_a_sample_is_grouped_in_the_whole_datasets_mega_batches(
    lengths, batch_size, dataset_size, seed
):
    pytest.importorskip("transformers", reason="transformers is not installed (pip install .[hf])")
    from transformers.trainer_pt_utils import get_length_grouped_indices

    mult = mega_batch_mult(dataset_size, batch_size)
    real = get_length_grouped_indices(
        lengths, batch_size, mega_batch_mult=mult, generator=torch.Generator().manual_seed(seed)
    )
    ours = grouped_indices_reference(lengths, batch_size, torch.Generator().manual_seed(seed), mult)
    assert ours == real
    got = length_grouped_indices(
        np.array(lengths), batch_size, seed=seed, dataset_size=dataset_size
    )
    assert got.tolist() == real


def test_the_timed_set_is_grouped_as_well_as_the_whole_epoch():
    """The grouped peers' timed batches waste no more than a whole epoch of theirs: a
    small timed set sorted in smaller mega-batches made them look worse than they are."""
    s = harness._setup(
        quick_args("--samples", "20000", "--epoch-samples", "2000", "--batch-size", "64")
    )
    whole, timed = (
        batching.epoch_batches("grouped", s),
        batching.epoch_batches("grouped", s, s.timed_ids),
    )

    def share(fam, lengths):
        return sum(int(lengths[b].sum()) for b in fam.epoch) / sum(r * n for r, n in fam.shapes)

    # 0.72 against 0.77 (a random 10% of the samples); grouped on its own, 0.42
    assert share(timed, s.lengths) >= share(whole, s.lengths) - 0.08


def result(name, med, lo, hi, job, losses=(), family="grouped", eff=0.8, epoch=10.0):
    return StrategyResult(
        name,
        family=family,
        peer=name in PEERS,
        useful_tokens_per_sec=med,
        tokens_per_sec_min=lo,
        tokens_per_sec_max=hi,
        round_tokens_per_sec=[lo, med, hi],
        round_epoch_s=[epoch] * 3,
        epoch_s=epoch,
        warmup_s=job - epoch,
        job_s=job,
        job10_s=job + 9 * epoch,
        token_efficiency=eff,
        losses=list(losses),
    )


def test_headline_is_printed_as_measured_also_below_one():
    results = [
        result("grouped-eager", 40.0, 39.0, 41.0, 100.0),
        result("grouped-dynamic", 30.0, 29.0, 31.0, 150.0),
        result("shapebucket", 36.0, 35.0, 37.0, 120.0, family="buckets"),
    ]
    head = headline(results)
    assert head.peer.name == "grouped-eager" and head.ours.name == "shapebucket"
    assert head.ratio == pytest.approx(0.9) and not head.within_noise
    text = format_table(results)
    assert "0.90x [rounds 0.90-0.90] the best strategy without shapebucket (grouped-eager" in text
    assert "slower" in text
    assert "shapebucket 120 s vs grouped-eager 100 s" in text and "the peer first" in text
    assert head.ceiling == pytest.approx(1.0) and "= 90% of it" in text
    # the whole job compares the first of each side to finish, not the fastest
    slow_start = [*results, result("grouped-compile", 39.0, 38.5, 39.5, 90.0)]
    assert headline(slow_start).peer.name == "grouped-eager"
    assert headline(slow_start).job_peer.name == "grouped-compile"
    close = [
        result("grouped-eager", 40.0, 35.0, 45.0, 100.0),
        result("shapebucket", 42.0, 41.0, 43.0, 90.0, family="buckets"),
    ]
    assert headline(close).within_noise and "within noise" in format_table(close)
    # ten epochs: a slow start and a fast epoch wins; the ceiling is against the grouped peer
    packed = result(
        "shapebucket-packed", 50.0, 49.0, 51.0, 130.0, family="packed", eff=0.98, epoch=5.0
    )
    fixed = result(
        "fixed-packed-eager", 45.0, 44.0, 46.0, 95.0, family="fixed", eff=0.97, epoch=8.0
    )
    head = headline([*results, packed, fixed])
    assert head.peer.name == "fixed-packed-eager" and head.grouped.name == "grouped-eager"
    assert head.job_peer.name == "fixed-packed-eager" and head.job_ours.name == "shapebucket"
    assert head.job10_ours.name == "shapebucket-packed"  # 175 s against 167 s for fixed
    assert head.job10_ratio == pytest.approx((95 + 72) / (125 + 50))
    assert head.ceiling == pytest.approx(0.98 / 0.8)


def test_check_losses_compares_within_a_family_only():
    a = result("grouped-eager", 1, 1, 1, 1, losses=[5.0, 4.0, 3.0])
    b = result("grouped-compile", 1, 1, 1, 1, losses=[5.0, 4.0001, 3.0])
    c = result("grouped-dynamic", 1, 1, 1, 1, losses=[5.0, 4.5, 3.0])
    other = result("shapebucket", 1, 1, 1, 1, losses=[1.0, 1.0, 1.0], family="buckets")
    assert check_losses([a, b, other]) == []
    problems = check_losses([a, b, c])
    assert len(problems) == 1 and problems[0].startswith("grouped-dynamic: step 1")


def test_bad_bench_arguments_give_one_error_line(capsys):
    for argv, needle in [
        (["--strategies", "nope"], "unknown strategies ['nope']"),
        (["--rounds", "0"], "--rounds must be >= 1"),
        (["--mode", "reduce-overhead"], "needs --device cuda"),
        (["--model-dim", "30"], "multiple of --heads"),
        # probe: these two printed a traceback (exit 1), the second after building the workload
        (["--device", "banana"], "--device 'banana' is not a torch device"),
        # probe: a meta device passed the up-front checks and failed in the first step
        (["--device", "meta"], "not on a meta device"),
        (["--lengths", "/nonexistent/lengths.txt"], "does not exist"),
    ]:
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and needle in err[0]


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--plot", "{tmp}/run.unknownext"], "cannot write '.unknownext' files"),
        (["--plot", "{tmp}/file.txt/run.png"], "is a file, not a directory"),
        (["--json", "{tmp}/file.txt/run.json"], "is a file, not a directory"),
        (["--json", "{tmp}/file.txt/deeper/run.json"], "is a file, not a directory"),
        (["--json", "{tmp}"], "is not a file name"),
        (["--json", "", "--plot", "{tmp}/x.unknownext"], "cannot write '.unknownext' files"),
    ],
)
def test_output_paths_are_checked_before_anything_is_measured(
    tmp_path, monkeypatch, capsys, flags, needle
):
    """Issue 30, defect 7: a bad --plot or --json gave a traceback after the whole run."""
    (tmp_path / "file.txt").write_text("a regular file")
    monkeypatch.setattr(cli, "run", lambda args: pytest.fail("measured before the checks"))
    assert cli.main(["--quick", *(f.format(tmp=tmp_path) for f in flags)]) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("error: ") and needle in line and captured.out == ""


def test_a_missing_output_directory_is_made(tmp_path, monkeypatch):
    """The default results/ may not exist yet: the run makes it (checked it can, first)."""
    seen = {}

    def stop(args):
        seen.update(json=args.json, plot=args.plot)
        raise KeyboardInterrupt  # stop where the measuring would start

    monkeypatch.setattr(cli, "run", stop)
    out = tmp_path / "new" / "dir"
    with pytest.raises(KeyboardInterrupt):
        cli.main(["--quick", "--json", str(out / "r.json"), "--plot", str(out / "r")])
    assert seen == {"json": str(out / "r.json"), "plot": str(out / "r.png")}


@pytest.mark.slow  # reads every workload: 7 s
def test_workloads():
    text = stdlib_docstring_lengths()
    assert len(text) > 1000 and text.min() >= 2
    lengths, clipped = load_workload("text", n=0, max_len=256, seed=0)
    assert lengths.max() <= 256 and clipped == int((text > 256).sum())
    mix, clipped = load_workload("mixture", n=1000, max_len=256, seed=0)
    assert len(mix) == 1000 and clipped == 0 and mix.min() >= 6 and mix.max() <= 256
    assert np.array_equal(mix, load_workload("mixture", n=1000, max_len=256, seed=0)[0])
    caps = caption_lengths(100_000, seed=0)
    shares = [np.mean((caps >= lo) & (caps <= hi)) for lo, hi in [(5, 31), (33, 63), (65, 255)]]
    assert shares == pytest.approx([0.90, 0.09, 0.01], abs=0.005)


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (none on this project's machines)"
)
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_quick_run_on_gpu(tmp_path, mode):
    out = bench("--quick", "--device", "cuda", "--mode", mode, "--json", str(tmp_path / "r.json"))
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads((tmp_path / "r.json").read_text())
    assert all(r["error"] is None for r in data["results"]), data["results"]


# options whose None means "not given" (no default to fill): an input file, torch.compile's
# own default mode, and the replay switch
NOT_GIVEN = {"lengths", "mode", "from_json", "profile", "tokens_per_step", "rows_budget_mb"}


def test_every_default_is_set_and_matches_its_help():
    """Every option the harness reads has its value after the CLI and the harness's setup
    filled the defaults (a typo here fails fast, not in a 10-minute run), and every
    default the help states ("default 5, quick 2") is the one applied. The options come
    from the parser, so a new one is checked without editing this test."""
    actions = [a for a in cli._parser()._actions if a.dest != "help"]
    assert len(actions) >= 24
    for quick in (False, True):
        args = cli._parser().parse_args(["--quick"] * quick)
        cli._resolve(args)
        harness._setup(args)  # fills the defaults that depend on the lengths
        for action in actions:
            value = getattr(args, action.dest)
            if action.dest in NOT_GIVEN:
                assert value is None, action.dest
                continue
            assert value is not None, f"{action.option_strings[0]} has no value"
            if action.type is int:
                assert isinstance(value, int) and value >= 0, (action.dest, value)
            stated = re.search(
                r"default (\d+(?:,\d{3})*)(?:, quick (\d+(?:,\d{3})*))?", action.help or ""
            )
            if stated:
                full, small = (int(g.replace(",", "")) if g else None for g in stated.groups())
                want = small if quick and small is not None else full
                assert value == want, (action.dest, quick, value, want)
            elif action.default is not None and action.dest != "quick":  # set by argv
                assert value == action.default, action.dest
        assert args.bucket_tokens_per_batch == args.batch_size * 32  # as its help says
    for key in cli._DEFAULTS:  # every --quick-dependent default is stated in the help
        action = next(a for a in actions if a.dest == key)
        assert "quick" in (action.help or ""), key


def test_from_json_replays_a_saved_run_without_measuring(tmp_path, capsys):
    from dataclasses import asdict

    results = [
        result("grouped-eager", 40.0, 39.0, 41.0, 100.0),
        result("shapebucket", 44.0, 43.0, 45.0, 120.0, family="buckets"),
    ]
    config = {
        "workload": "mixture",
        "samples": 10,
        "mean_length": 5.0,
        "clipped_to_max_len": 0,
        "model": {"max_len": 256},
        "batch_size": 2,
        "buckets": [8],
        "rounds": 3,
        "timed_samples": 10,
        "timed_real_tokens": 50,
        "grouped_sampler": "g",
        "torch": "x",
        "device": "cpu",
        "mode": None,
        "machine": "m",
        "strategies": {"grouped-eager": "", "shapebucket": ""},
    }
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"config": config, "results": [asdict(r) for r in results]}))
    assert cli.main(["--from-json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "1.10x [rounds 1.10-1.10] the best strategy without shapebucket (grouped-eager" in out
    assert "faster" in out
    assert (tmp_path / "run.png").read_bytes()[:4] == b"\x89PNG"
    (tmp_path / "bad.json").write_text("{}")
    assert cli.main(["--from-json", str(tmp_path / "bad.json")]) == 2
    assert capsys.readouterr().err.startswith("error:")
    # the plot path is checked before the table is printed (issue 30, defect 7)
    missing = tmp_path / "missing" / "run.png"
    assert cli.main(["--from-json", str(path), "--plot", str(missing)]) == 2
    captured = capsys.readouterr()
    assert "does not exist" in captured.err and captured.out == "" and not missing.exists()
    # a run saved by an earlier version (sampled steps, no whole-epoch rounds) is refused
    earlier = [{**asdict(r), "round_epoch_s": []} for r in results]
    path.write_text(json.dumps({"config": config, "results": earlier}))
    assert cli.main(["--from-json", str(path)]) == 2
    assert "earlier version" in capsys.readouterr().err
    # probe: a wrongly typed, missing or impossible field printed a traceback halfway
    # through the table or after it, or was shown as if measured
    good = [asdict(r) for r in results]
    for field, value, says in [
        (
            "useful_tokens_per_sec",
            "fast",
            "useful_tokens_per_sec must be a number >= 0, got 'fast'",
        ),
        ("useful_tokens_per_sec", -1.0, "must be a number >= 0, got -1.0"),
        ("tokens_per_sec_max", float("nan"), "tokens_per_sec_max must be a number >= 0, got nan"),
        ("timed_compile_s", True, "timed_compile_s must be a number >= 0, got True"),
        ("round_epoch_s", [1.0, "x"], "round_epoch_s must be a list of numbers >= 0"),
        ("peer", 1, "peer must be a bool, got 1"),
        ("epoch_s", None, "epoch_s must be a number >= 0, got None"),
    ]:
        bad = [{**good[0], field: value}, good[1]]
        path.write_text(json.dumps({"config": config, "results": bad}))
        assert cli.main(["--from-json", str(path)]) == 2, field
        captured = capsys.readouterr()
        assert (
            captured.err.startswith("error: results[0] ('grouped-eager'): ")
            and says in captured.err
        )
        assert captured.out == ""
    gone = [{k: v for k, v in good[0].items() if k != "epoch_s"}, good[1]]
    for bad_results, says in [
        (gone, "lacks ['epoch_s']: it was not written by this version"),
        ([], "its results are an empty list"),
        ([good[0], good[0]], "lists a strategy twice"),
    ]:
        path.write_text(json.dumps({"config": config, "results": bad_results}))
        assert cli.main(["--from-json", str(path)]) == 2
        captured = capsys.readouterr()
        assert says in captured.err and captured.out == ""
