"""The report's plots: a thin last layer, one function per figure, each taking a table and writing a PNG.

Every figure is small multiples sharing the y axis (one panel per engine, or per world size) with a handful
of series per panel. The settings a figure does not examine are held at one reference slice, named in its
subtitle; the CSV tables keep every cell. Legends sit below the panels. Headless (Agg). A cell without a
number is written as its status word where its point or bar would be, never drawn as 0.

canvas.py is what every figure is drawn on (the slice, colours, panels, legend, saving); the figures, by
kind: scaling_lines.py (against world size), sweep_lines.py (against a swept setting), bars.py (per dtype,
per phase, per engine), speedup.py (the answer's speedups).
"""

import matplotlib

matplotlib.use("Agg")  # before any figure module imports pyplot: no display, ever

from bench.report.plots.bars import engines, phases, precision  # noqa: E402
from bench.report.plots.scaling_lines import scaling, side_by_side  # noqa: E402
from bench.report.plots.speedup import speedup_plot  # noqa: E402
from bench.report.plots.sweep_lines import accumulation, bucket_sweep  # noqa: E402

__all__ = ["accumulation", "bucket_sweep", "engines", "phases", "precision", "scaling", "side_by_side",
           "speedup_plot"]
