"""The triton kernels of :mod:`.kernel`, loaded by it on first use (once per
``TRITON_INTERPRET`` setting): ``_place`` is the int64 offset arithmetic, ``pad_kernel``
pads with it, ``probe`` stores what it computes.

The integer arguments are never specialised (``do_not_specialize``): compiled triton
passes an int argument equal to 1 as a Python constant, which has no ``.to`` (only a
GPU run finds it: the interpreter passes every int as a scalar).
"""

import triton
import triton.language as tl


@triton.jit  # type: ignore[misc]
def _place(p, NB, offsets, lengths, n, L, F, LEFT: tl.constexpr, BLOCK: tl.constexpr):
    # program p: block p % NB of row p // NB; for each element e of that block of row r,
    # where it is written (dst), read (src), and whether it is real
    p64 = p.to(tl.int64)
    NB64 = NB.to(tl.int64)
    r64 = p64 // NB64
    L64 = L.to(tl.int64)
    F64 = F.to(tl.int64)
    e = (p64 % NB64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    inside = e < L64 * F64
    pos = e // F64  # position in the row
    f = e % F64  # index in the trailing dims
    has = r64 < n
    ln = tl.load(lengths + r64, mask=has, other=0).to(tl.int64)
    off = tl.load(offsets + r64, mask=has, other=0).to(tl.int64)
    q = pos - (L64 - ln) * LEFT  # the sample's own position (LEFT: 1 for left padding)
    real = inside & (q >= 0) & (q < ln)
    return r64 * L64 * F64 + e, (off + q) * F64 + f, real, inside


@triton.jit(do_not_specialize=["n", "L", "F", "first", "NB"])  # type: ignore[misc]
def pad_kernel(
    src, offsets, lengths, pad, out, n, L, F, first, NB, LEFT: tl.constexpr, BLOCK: tl.constexpr
):  # fmt: skip
    p = first.to(tl.int64) + tl.program_id(0).to(tl.int64)
    dst, at, real, inside = _place(p, NB, offsets, lengths, n, L, F, LEFT, BLOCK)
    x = tl.load(src + at, mask=real, other=0)
    fill = tl.load(pad)
    tl.store(out + dst, tl.where(real, x, fill), mask=inside)


@triton.jit(do_not_specialize=["p", "NB", "n", "L", "F"])  # type: ignore[misc]
def probe(
    dst_out, src_out, p, NB, offsets, lengths, n, L, F, LEFT: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    dst, at, real, _ = _place(p, NB, offsets, lengths, n, L, F, LEFT, BLOCK)
    i = tl.arange(0, BLOCK)
    tl.store(dst_out + i, dst)
    tl.store(src_out + i, tl.where(real, at, -1))
