"""``RowsReport``: what :func:`~shapebucket.calibrate.calibrate_rows` measured, per length."""

from __future__ import annotations

from dataclasses import dataclass

from ..plan.shapes import Shape

__all__ = ["Probe", "RowsReport", "size"]


@dataclass(frozen=True)
class Probe:
    """One measured step: ``rows`` rows at the length, its ``peak`` in bytes (``None``:
    the device ran out of memory) and whether it stayed within the limit."""

    rows: int
    peak: int | None
    fits: bool


@dataclass(frozen=True)
class RowsReport:
    """The largest rows per length whose whole step peaks within ``limit`` bytes.

    ``rows``, ``peak`` (bytes at those rows) and ``over`` (the smallest row count
    measured over the limit, one more than ``rows`` where the search bracketed it;
    ``None`` where ``max_rows`` fitted) are keyed by length; ``probes`` lists every
    measured step of each length in order. ``limit`` is ``budget * (1 - margin)``.
    ``measured`` is ``"eager"`` or ``"compiled"`` (graphs were compiled during the
    search) and ``why`` says why that measurement holds for training.

    ``rows`` feeds the samplers and collators as it is:
    ``PackedBatchSampler(lengths, buckets, rows=report.rows)``,
    ``BucketBatchSampler(lengths, buckets, rows=report.rows)``,
    ``BucketCollator(buckets, rows=report.rows)``; :meth:`shapes` are the shapes
    a plan built from them has.

    >>> r = RowsReport(rows={8: 4}, peak={8: 900}, over={8: 5}, probes={8: ()}, budget=1000,
    ...                margin=0.0, limit=1000, seconds=0.1, measured="eager", why="", device="cpu")
    >>> sorted(r.shapes()), r.over_peak(8)
    ([Shape(rows=4, length=8)], None)
    """

    rows: dict[int, int]
    peak: dict[int, int]
    over: dict[int, int | None]
    probes: dict[int, tuple[Probe, ...]]
    budget: int
    margin: float
    limit: int
    seconds: float
    measured: str
    why: str
    device: str

    def shapes(self) -> frozenset[Shape]:
        """``Shape(rows, length)`` for every length."""
        return frozenset(Shape(r, L) for L, r in self.rows.items())

    def over_peak(self, length: int) -> int | None:
        """The peak in bytes of the bracketing row count (``None``: not bracketed, or the
        device ran out of memory there)."""
        over = self.over[length]
        return next((p.peak for p in self.probes[length] if p.rows == over), None)

    def steps(self) -> int:
        """How many steps the search measured, over all lengths."""
        return sum(len(p) for p in self.probes.values())

    def __str__(self) -> str:
        lines = [
            f"rows within {size(self.limit)} (budget {size(self.budget)} less "
            f"{self.margin:.0%}) on {self.device}, {self.measured} steps, "
            f"{self.steps()} measured in {self.seconds:.1f} s",
            f"{'length':>8} {'rows':>6} {'peak':>10} {'over':>6} {'its peak':>10} {'steps':>6}",
        ]
        for L in sorted(self.rows):
            over, op = self.over[L], self.over_peak(L)
            lines.append(
                f"{L:>8} {self.rows[L]:>6} {size(self.peak[L]):>10} "
                f"{'-' if over is None else over:>6} "
                f"{'-' if op is None else size(op):>10} {len(self.probes[L]):>6}"
            )
        return "\n".join(lines)


def size(nbytes: int) -> str:
    """Bytes in the largest binary unit that keeps the number >= 1 as printed: the one
    byte formatting of calibration's reports and errors (a budget of a few KiB reads as
    KiB, never as ``0.0 MiB``; ``2**20 - 1`` reads as ``1.0 MiB``, not ``1024.0 KiB``).

    >>> size(512), size(1536), size(3 * 2**19), size(2**20 - 1), size(5 * 2**30)
    ('512 B', '1.5 KiB', '1.5 MiB', '1.0 MiB', '5.0 GiB')
    """
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale * 1023.95 / 1024:  # what would print as 1024.0 of the unit below
            return f"{nbytes / scale:.1f} {unit}"
    return f"{int(nbytes)} B"
