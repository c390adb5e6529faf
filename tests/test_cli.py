import numpy as np
import pytest

from shapebucket.__main__ import main
from shapebucket.advise.kchoice import choose_k
from shapebucket.data import mixture_lengths, read_lengths
from shapebucket.errors import ShapeBucketError
from shapebucket.fit.optimal import fit_buckets


def test_suggest_text_file_prints_table_and_paste_line(tmp_path, capsys):
    path = tmp_path / "lengths.txt"
    path.write_text("\n".join(map(str, mixture_lengths(5000))))
    png = tmp_path / "hist.png"
    assert main(["suggest", str(path), "--k", "4", "--align", "8", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "fitted (k=4)" in out and "powers of two" in out
    assert "buckets = shapebucket.fit.Buckets([" in out
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"


def test_suggest_npy_and_random_sampler(tmp_path, capsys):
    path = tmp_path / "lengths.npy"
    np.save(path, mixture_lengths(3000))
    assert main(["suggest", str(path), "--batching", "random", "--batch-size", "16"]) == 0
    assert "batching='random'" in capsys.readouterr().out
    # the old flag is gone: a usage error
    with pytest.raises(SystemExit) as exit_:
        main(["suggest", str(path), "--sampler", "random"])
    assert exit_.value.code == 2 and "--sampler" in capsys.readouterr().err


def test_bad_files(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_text("3\n4\nfive\n")
    with pytest.raises(ShapeBucketError, match="line 3: 'five' is not an int"):
        read_lengths(bad)
    assert main(["suggest", str(bad)]) == 2
    assert "line 3: 'five' is not an int" in capsys.readouterr().err
    assert main(["suggest", str(tmp_path / "missing.txt")]) == 2


# -- issue 22, item 8 ----------------------------------------------------------------------


def test_plot_without_extension_writes_and_names_the_png(tmp_path, capsys):
    path = tmp_path / "lengths.npy"
    np.save(path, mixture_lengths(2000))
    assert main(["suggest", str(path), "--k", "3", "--plot", str(tmp_path / "hist")]) == 0
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / 'hist.png'}\n" in out
    assert (tmp_path / "hist.png").read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "hist").exists()
    # another format matplotlib writes is kept as asked
    assert main(["suggest", str(path), "--k", "3", "--plot", str(tmp_path / "hist.svg")]) == 0
    assert (tmp_path / "hist.svg").read_text().lstrip().startswith("<?xml")


def test_unknown_plot_format_is_refused_before_any_work(tmp_path, capsys):
    path = tmp_path / "lengths.npy"
    np.save(path, mixture_lengths(2000))
    assert main(["suggest", str(path), "--plot", str(tmp_path / "x.unknownext")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # refused before the table
    (line,) = captured.err.strip().splitlines()
    assert "cannot write '.unknownext' files" in line and ".png" in line
    assert "Traceback" not in captured.err and not (tmp_path / "x.unknownext").exists()


def test_job_flags_without_k_auto_are_refused_like_the_api(tmp_path, capsys):
    path = tmp_path / "lengths.npy"
    np.save(path, mixture_lengths(2000))
    for flags in (["--compile-seconds", "5"], ["--job-samples", "100", "--max-k", "4"]):
        assert main(["suggest", str(path), "--k", "4", *flags]) == 2
        err = capsys.readouterr().err
        assert (
            "the job for --k auto; with a fixed number of buckets (--k 4" in err
            and "would be ignored" in err
        )
        assert flags[0] in err
    with pytest.raises(TypeError):  # the job belongs to shapebucket.advise.choose_k
        fit_buckets(mixture_lengths(100), 4, compile_seconds=5.0)


def auto(path, *extra):
    job = ["--compile-seconds", "1", "--job-samples", str(10**9), "--tokens-per-second", "1e5"]
    return main(["suggest", str(path), "--k", "auto", "--align", "1", *job, *extra])


def test_k_auto_above_the_recompile_limit_says_what_it_means(tmp_path, capsys):
    path = tmp_path / "lengths.npy"
    np.save(path, mixture_lengths(20_000))
    assert auto(path) == 0
    out = capsys.readouterr().out
    chosen = int(next(line for line in out.splitlines() if "<- chosen" in line).split()[0])
    assert chosen > 8
    assert f"note: K={chosen} is above the recompile limit (8): shapebucket.prewarm raises" in out
    # the policy table marks the set and says under it what that costs
    assert f"fitted (k={chosen})" in out and "(over recompile limit)" in out
    assert "over recompile limit: more than 8 buckets, one compile each" in out


@pytest.mark.slow  # choose_k up to max_k=400 on 20,000 lengths
def test_k_auto_stopped_by_max_k_says_so(tmp_path, capsys):
    lengths = mixture_lengths(20_000)
    path = tmp_path / "lengths.npy"
    np.save(path, lengths)
    assert auto(path, "--max-k", "4") == 0
    out = capsys.readouterr().out
    assert "K=4 is max_k, the largest K tried" in out
    job = {"compile_seconds": 1.0, "job_samples": 10**9, "tokens_per_second": 1e5, "align": 1}
    assert choose_k(lengths, max_k=4, **job).capped
    full = choose_k(lengths, max_k=400, **job)  # stops when more K changes nothing
    assert not full.capped and "max_k" not in str(full)
    assert full.chosen.k < 400


@pytest.mark.parametrize(
    ("plot", "needle"),
    [
        ("", "'' is not a file name"),  # issue 30 (low): --plot '' was ignored silently
        ("{tmp}/missing/hist.png", "does not exist; create it first"),
        ("{tmp}/file.txt/hist.png", "is a file, not a directory"),
        ("{tmp}/hist.unknownext", "cannot write '.unknownext' files"),
    ],
)
def test_suggest_checks_its_plot_path_before_any_work(tmp_path, capsys, plot, needle):
    path = tmp_path / "lengths.npy"
    np.save(path, mixture_lengths(500))
    (tmp_path / "file.txt").write_text("a regular file")
    assert main(["suggest", str(path), "--plot", plot.format(tmp=tmp_path)]) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("error: ") and needle in line and captured.out == ""
