"""``import shapebucket`` loads no part of the compiler (``torch._dynamo``, inductor).

Every DataLoader worker, spawned process and ``torchrun`` rank imports the package; the
compiler loads when something is compiled or a ``BucketedModel`` is built, not before.
Each check runs in a fresh interpreter that has imported nothing else.
"""

import json
import subprocess
import sys

#: the package and its public subpackages that a worker or a rank may import
LIGHT = [
    "shapebucket",
    "shapebucket.fit",
    "shapebucket.plan",
    "shapebucket.sampling",
    "shapebucket.collate",
    "shapebucket.compile",
    "shapebucket.bucketed",
    "shapebucket.advise",
    "shapebucket.calibrate",
]

#: the compiler modules loaded so far, and the marks a BucketedModel defers
_PROBE = """
import json, sys
from shapebucket.bucketed import model as bm, tracing
marks = [
    hasattr(bm.BucketedModel.pad, "__wrapped__"),
    hasattr(tracing.cut_back, "__wrapped__"),
    getattr(bm.BucketedModel.bucketed_call, "_torchdynamo_disable", False),
    getattr(tracing.Forward.__call__, "_torchdynamo_disable", False),
]
compiler = [m for m in sys.modules if m.startswith(("torch._dynamo", "torch._inductor"))]
print(json.dumps({"compiler": sorted(compiler), "marks": marks}), file=sys.stderr)
"""
_BUILD = "import torch, shapebucket\nm = shapebucket.BucketedModel(torch.nn.Linear(2, 2), [4])\n"
_PICKLE = "import pickle\nsys.stdout.buffer.write(pickle.dumps(m))\n"
_LOAD = "import pickle, sys\npickle.loads(sys.stdin.buffer.read())\n"


def _run(code: str, stdin: bytes = b"") -> tuple[dict, bytes]:
    out = subprocess.run([sys.executable, "-c", code], input=stdin, capture_output=True, check=True)
    return json.loads(out.stderr.decode().splitlines()[-1]), out.stdout


def test_importing_the_package_loads_no_compiler():
    probe, _ = _run("".join(f"import {m}\n" for m in LIGHT) + _PROBE)
    assert probe == {"compiler": [], "marks": [False] * 4}


def test_a_bucketed_model_applies_its_compiler_marks_when_built_or_unpickled():
    """The marks the package defers (``skip_frame_only``, ``not_compiled``) are in place
    once a wrapper is built, and once one is unpickled in a fresh process."""
    built, data = _run(_BUILD + _PROBE + _PICKLE)
    assert built["marks"] == [True] * 4
    assert "torch._dynamo" in built["compiler"]  # the probe sees the compiler when it loads
    loaded, _ = _run(_LOAD + _PROBE, stdin=data)
    assert loaded["marks"] == [True] * 4
