"""Report figures: numbers in, matplotlib figures out, rendered to inline SVG. One name space
for the three modules that make them:

- :mod:`gpubench.reports.drawing`: the style and the helpers every figure shares (SVG output,
  plain-number log axes, legends under the axes, row labels, :func:`mark_data`);
- :mod:`gpubench.reports.charts`: the generic figures of every report (speedup, ratios, raw
  samples, share of the peak, telemetry);
- :mod:`gpubench.reports.plots`: the figures a technique declares (:func:`declared`).
"""

from gpubench.reports.charts import latency_boxes, peak_bars, ratio_points, speedup_sweep, telemetry_timeline
from gpubench.reports.drawing import (
    COLORS,
    REFERENCE,
    SERIES,
    STYLE,
    WIDTH_IN,
    PlainLogLocator,
    close,
    label_rows,
    legend_below,
    log_axis,
    log_ticks,
    mark_data,
    plain_number,
    row_labels,
    styled,
    ticks_at,
    time_unit,
    to_svg,
    wrap,
)
from gpubench.reports.plots import declared, human, read_value

__all__ = [
    "COLORS",
    "REFERENCE",
    "SERIES",
    "STYLE",
    "WIDTH_IN",
    "PlainLogLocator",
    "close",
    "declared",
    "human",
    "label_rows",
    "latency_boxes",
    "legend_below",
    "log_axis",
    "log_ticks",
    "mark_data",
    "peak_bars",
    "plain_number",
    "ratio_points",
    "read_value",
    "row_labels",
    "speedup_sweep",
    "styled",
    "telemetry_timeline",
    "ticks_at",
    "time_unit",
    "to_svg",
    "wrap",
]
