"""The look of every figure, in one place: size, resolution and one colour per concept, so a colour means
the same thing in every plot of the report and of the projection (exposed communication is red wherever
it is drawn, hidden communication orange, compute blue).
"""

from __future__ import annotations

from bench.engines import loaded as engine_names
from bench.schema import PRECISIONS

DPI = 110
PANEL = (3.3, 2.6)             # inches per panel of the report's faceted figures
PROJECTION_PANEL = (4.2, 3.2)  # inches per panel of the projection's figure (fewer, larger panels)

# the parts of a step (the Why section's breakdown and the phase bars)
COMPUTE = "tab:blue"
EXPOSED_COMM = "tab:red"
HIDDEN_COMM = "tab:orange"
MEMORY = "tab:gray"
IDLE = "0.85"
WAIT = "tab:purple"            # communication waiting for the last rank (the cross-rank view)
# reference lines
IDEAL = "0.45"                 # perfect scaling
THRESHOLD = "0.15"             # the efficiency threshold (dotted)

# series: engines in registry order, precisions in vocabulary order; more engines than colours cycle on
_ENGINE_PALETTE = ("tab:blue", "tab:brown", "tab:olive", "tab:green", "tab:cyan", "tab:pink")
ENGINE_COLORS = {e: _ENGINE_PALETTE[i % len(_ENGINE_PALETTE)] for i, e in enumerate(engine_names())}
PRECISION_COLORS = dict(zip(PRECISIONS, ("#3d3d3d", "tab:cyan", "tab:purple", "tab:pink")))
SPARE_COLORS = ("tab:olive", "tab:gray", "#17becf", "tab:brown")
