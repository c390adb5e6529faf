import numpy as np
import pytest

from shapebucket.__main__ import main
from shapebucket.data import mixture_lengths, read_lengths
from shapebucket.errors import ShapeBucketError


def test_suggest_text_file_prints_table_and_paste_line(tmp_path, capsys):
    path = tmp_path / "lengths.txt"
    path.write_text("\n".join(map(str, mixture_lengths(5000))))
    png = tmp_path / "hist.png"
    assert main(["suggest", str(path), "--k", "4", "--align", "8", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "fitted (k=4)" in out and "powers of two" in out
    assert "buckets = shapebucket.Buckets([" in out
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
