"""Every bad command line answers with one ``error:`` line on stderr and exit status 2:
no traceback, no usage block, no raw numpy or OS error."""

from __future__ import annotations

import numpy as np
import pytest

from shapebucket.__main__ import main


def _files(tmp):
    good = tmp / "good.npy"
    np.save(good, np.random.default_rng(0).integers(1, 300, 500))
    made = {"good": good}

    def text(name, content):
        made[name] = tmp / f"{name}.txt"
        made[name].write_text(content)

    text("empty", "")
    text("blank", "\n \n\n")
    text("dashes", "3\n--5\n7\n")
    text("float", "3\n3.5\n")
    text("negative", "3\n-4\n")
    text("zero", "3\n0\n")
    text("huge", "3\n99999999999999999999999\n")
    text("outlier", f"3\n{2**40}\n")
    (tmp / "binary.txt").write_bytes(bytes(range(256)))
    made["binary"] = tmp / "binary.txt"
    np.save(tmp / "empty.npy", np.array([], dtype=np.int64))
    made["empty_npy"] = tmp / "empty.npy"
    np.save(tmp / "object.npy", np.array([1, "a"], dtype=object), allow_pickle=True)
    made["object_npy"] = tmp / "object.npy"
    (tmp / "corrupt.npy").write_bytes((tmp / "empty.npy").read_bytes()[:20])
    made["corrupt_npy"] = tmp / "corrupt.npy"
    np.save(tmp / "floats.npy", np.array([1.5, 2.0]))
    made["float_npy"] = tmp / "floats.npy"
    np.save(tmp / "matrix.npy", np.ones((3, 3), dtype=np.int64))
    made["matrix_npy"] = tmp / "matrix.npy"
    (tmp / "adir").mkdir()
    made["dir"] = tmp / "adir"
    made["missing"] = tmp / "missing.txt"
    text("partial_run", '{"results": [], "config": {}}')
    return made


def _auto(compile_s, samples, rate):
    """``suggest --k auto`` with the three job flags."""
    job = {"--compile-seconds": compile_s, "--job-samples": samples, "--tokens-per-second": rate}
    return ["suggest", "{good}", "--k", "auto", *(x for kv in job.items() for x in kv)]


CASES = [
    (["suggest", "{empty}"], "is empty"),
    (["suggest", "{blank}"], "is empty"),
    (["suggest", "{dashes}"], "line 2: '--5' is not an int"),
    (["suggest", "{float}"], "line 2: '3.5' is not an int"),
    (["suggest", "{negative}"], "line 2: '-4' is not an int"),
    (["suggest", "{zero}"], "has length 0"),
    (["suggest", "{huge}"], "does not fit in int64"),
    (["suggest", "{outlier}"], "> 1073741824"),
    (["suggest", "{binary}"], "not a text file"),
    (["suggest", "{empty_npy}"], "is empty"),
    (["suggest", "{object_npy}"], "not a readable .npy integer array"),
    (["suggest", "{corrupt_npy}"], "not a readable .npy integer array"),
    (["suggest", "{float_npy}"], "must be integers"),
    (["suggest", "{matrix_npy}"], "must be 1-D"),
    (["suggest", "{dir}"], "is not a file"),
    (["suggest", "{missing}"], "does not exist"),
    (["suggest", "{good}", "--k", "0"], "k must be >= 1, got 0"),
    (["suggest", "{good}", "--k", "-3"], "k must be >= 1"),
    (["suggest", "{good}", "--k", "abc"], "invalid int or 'auto' value: 'abc'"),
    (["suggest", "{good}", "--align", "0"], "align must be >= 1"),
    (["suggest", "{good}", "--batch-size", "0"], "batch_size must be >= 1"),
    (["suggest", "{good}", "--batching", "sorted"], "invalid choice: 'sorted'"),
    (["suggest", "{good}", "--plot", "{missing}/x/y.png"], "does not exist; create it first"),
    (["suggest", "{good}", "--bogus"], "unrecognized arguments: --bogus"),
    (["suggest"], "required: lengths_file"),
    (["suggest", "{good}", "--k", "auto"], "--k auto needs --compile-seconds"),
    (_auto("0", "9", "5"), "argument --compile-seconds: must be > 0, got 0"),
    (_auto("nan", "9", "5"), "argument --compile-seconds: must be a finite number"),
    (_auto("3", "0", "5"), "argument --job-samples: must be >= 1, got 0"),
    (["suggest", "{good}", "--plot", "{dir}/x.unknownext"], "cannot write '.unknownext' files"),
    (["suggest", "{good}", "--plot", "{dir}/"], "is not a file name"),
    (["suggest", "{good}", "--compile-seconds", "5"], "describes the job for --k auto"),
    (
        ["suggest", "{good}", "--k", "3", "--job-samples", "9"],
        "(--k 3; 8 unless given) it would be ignored",
    ),
    ([*_auto("3", "9", "5"), "--max-k", "0"], "argument --max-k: must be >= 1, got 0"),
    (["suggest", "{good}", "--k", "auto", "--compile-seconds", "3"], "missing: --job-samples"),
    (["demo", "--samples", "0"], "--samples must be >= 1"),
    (["demo", "--samples", "-5"], "--samples must be >= 1"),
    (["demo", "--samples", "10000000000"], "--samples must be <= 100000000"),
    (["bench", "--samples", "10000000000"], "--samples must be <= 100000000"),
    (["suggest", "{good}", "--plot", "{good}/x.png"], "--plot"),
    (["nosuch"], "invalid choice: 'nosuch'"),
    ([], "required: command"),
    (["bench", "--rounds", "0"], "--rounds must be >= 1"),
    (["bench", "--workload", "nosuch"], "invalid choice: 'nosuch'"),
    (["bench", "--bogus"], "unrecognized arguments: --bogus"),
    (["bench", "--from-json", "{good}"], "is not a saved benchmark run"),
    (
        ["bench", "--from-json", "{partial_run}"],
        "is not a saved benchmark run: its results are an empty list",
    ),
    (["bench", "--from-json", ""], "--from-json needs the path of a saved run"),
    (["bench", "--json", "{dir}"], "is not a file name; pass e.g. '{dir}/out.json'"),
    (["bench", "--strategies", ","], "--strategies ',' names no strategy"),
    (["bench", "--strategies", "shapebucket,shapebucket"], "names shapebucket twice"),
]


@pytest.mark.parametrize(("argv", "needle"), CASES, ids=[" ".join(a) or "(none)" for a, _ in CASES])
def test_bad_command_line_is_one_error_line_and_exit_2(tmp_path, capsys, argv, needle):
    files = _files(tmp_path)
    argv = [a.format(**files) for a in argv]
    try:
        status = main(argv)
    except SystemExit as e:  # argparse's own errors exit from inside parse_args
        status = e.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert needle.format(**files) in lines[0]
    assert "Traceback" not in err
