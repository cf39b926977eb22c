"""Small inline-SVG charts for the run report: lines and bars with readable axes, no script, no network."""

from __future__ import annotations

import html
import math

from pipeline.progress import format_number

CHART_W, CHART_H = 520, 250
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 30, 46
LABEL_CHAR_W = 6.4  # px per character of an 11 px label, a little over the average
SERIES_COLOURS = ("#2a6fb0", "#d9822b", "#2f9e44", "#c92a2a", "#7048e8")
MARKED_POINTS = 40  # lines of at most this many points also mark each point


def fmt_number(value: float) -> str:
    """Tick labels: 1.5k, 20M; below a thousand three significant digits, never an exponent."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return format_number(value)


class _Axis:
    """Maps data values to [0, 1] on a linear or log10 scale, with readable ticks. `integer`: the values
    are counts, so ticks are whole numbers; `headroom`: the axis ends on the first tick above `hi`, so
    the largest value stays below the frame's top."""

    def __init__(self, lo: float, hi: float, log: bool = False, *, integer: bool = False, headroom: bool = False):
        self.integer = integer and not log
        self.step = 1.0
        if log:
            lo, hi = math.log10(max(lo, 1e-12)), math.log10(max(hi, 1e-12))
            lo, hi = math.floor(lo), max(math.ceil(hi), math.floor(lo) + 1)
        else:
            if hi <= lo:
                hi = lo + 1
            span = hi - lo
            step = 10 ** math.floor(math.log10(span / 5))
            step *= next(m for m in (1, 2, 5, 10) if span / (step * m) <= 6)
            self.step = max(step, 1) if self.integer else step
            if headroom:
                hi = (math.floor(hi / self.step + 1e-9) + 1) * self.step
        self.lo, self.hi, self.log = lo, hi, log

    def frac(self, value: float) -> float:
        value = math.log10(max(value, 1e-12)) if self.log else value
        return (value - self.lo) / (self.hi - self.lo)

    def ticks(self) -> list[float]:
        if self.log:
            return [10.0**e for e in range(int(self.lo), int(self.hi) + 1)]
        step = self.step
        first = math.ceil(self.lo / step - 1e-9) * step
        ticks = [first + i * step for i in range(int((self.hi - first) / step + 1e-9) + 1)]
        # whole steps written without float noise (0.30000000000000004), counts as integers
        return [int(round(t)) if self.integer else round(t, 12) for t in ticks]


def axis_top(value: float) -> float:
    """The top of a linear axis from 0 that holds `value` with room above it (the first tick above)."""
    return _Axis(0, value, headroom=True).hi


def _svg(title: str, parts: list[str], width: int = CHART_W, height: int = CHART_H) -> str:
    title = html.escape(title)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{title}"><title>{title}</title>'
        f'<text x="{width / 2}" y="16" text-anchor="middle" font-weight="bold">{title}</text>'
        + "".join(parts)
        + "</svg>"
    )


def _axes(x_axis: _Axis | None, y_axis: _Axis, x_label: str, y_label: str) -> list[str]:
    """Frame, y ticks and grid, x ticks (when x is numeric) and both axis labels."""
    plot_w, plot_h = CHART_W - LEFT - RIGHT, CHART_H - TOP - BOTTOM
    parts = [f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>']
    for tick in y_axis.ticks():
        y = TOP + plot_h * (1 - y_axis.frac(tick))
        parts.append(
            f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e4e4e4"/>'
            f'<text x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end">{fmt_number(tick)}</text>'
        )
    if x_axis is not None:
        for tick in x_axis.ticks():
            x = LEFT + plot_w * x_axis.frac(tick)
            parts.append(
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP + plot_h}" y2="{TOP + plot_h + 4}" stroke="#999"/>'
                f'<text x="{x:.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">{fmt_number(tick)}</text>'
            )
    parts.append(
        f'<text x="{LEFT + plot_w / 2}" y="{CHART_H - 6}" text-anchor="middle">{html.escape(x_label)}</text>'
        f'<text x="14" y="{TOP + plot_h / 2}" text-anchor="middle" '
        f'transform="rotate(-90 14 {TOP + plot_h / 2})">{html.escape(y_label)}</text>'
    )
    return parts


def svg_line(
    xs: list[float],
    ys: list[float],
    *,
    title: str,
    x_label: str,
    y_label: str,
    log: bool = False,
    integer_x: bool = False,
) -> str:
    """A line through (x, y) points, on log-log axes with `log`; `integer_x`: x counts (steps), so its
    ticks are whole numbers."""
    if not xs:
        return _svg(title, ['<text x="50%" y="50%" text-anchor="middle">no data</text>'])
    x_axis = _Axis(min(xs), max(xs), log, integer=integer_x)
    y_axis = _Axis(0 if not log else min(ys), max(ys), log, headroom=True)
    plot_w, plot_h = CHART_W - LEFT - RIGHT, CHART_H - TOP - BOTTOM
    points = " ".join(
        f"{LEFT + plot_w * x_axis.frac(x):.1f},{TOP + plot_h * (1 - y_axis.frac(y)):.1f}" for x, y in zip(xs, ys)
    )
    return _svg(
        title,
        _axes(x_axis, y_axis, x_label, y_label)
        + [f'<polyline points="{points}" fill="none" stroke="#2a6fb0" stroke-width="1.5"/>'],
    )


def svg_bars(labels: list[str], values: list[float], *, title: str, x_label: str, y_label: str) -> str:
    """Vertical bars of counts, one per label (every n-th label written when they would crowd), on
    whole-number ticks; the axis ends on a tick above the tallest bar."""
    if not values or max(values) <= 0:
        return _svg(title, ['<text x="50%" y="50%" text-anchor="middle">no data</text>'])
    y_axis = _Axis(0, max(values), integer=True, headroom=True)
    plot_w, plot_h = CHART_W - LEFT - RIGHT, CHART_H - TOP - BOTTOM
    slot = plot_w / len(values)
    label_every = max(1, math.ceil(len(values) * 34 / plot_w))
    parts = _axes(None, y_axis, x_label, y_label)
    for index, (label, value) in enumerate(zip(labels, values)):
        height = plot_h * y_axis.frac(value)
        x = LEFT + index * slot
        parts.append(
            f'<rect x="{x + slot * 0.1:.1f}" y="{TOP + plot_h - height:.1f}" width="{slot * 0.8:.1f}" '
            f'height="{height:.1f}" fill="#2a6fb0"><title>{html.escape(label)}: {format_number(value)}</title></rect>'
        )
        if (len(values) - 1 - index) % label_every == 0:  # counted from the last: its label is shown
            parts.append(
                f'<text x="{x + slot / 2:.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">{html.escape(label)}</text>'
            )
    return _svg(title, parts)


def svg_share_bars(labels: list[str], shares: list[float], *, title: str) -> str:
    """Horizontal bars of shares in [0, 1], one row per label; the label column is as wide as the longest
    label needs (a video id is never cut)."""
    row = 16
    label_w = max(220, int(LABEL_CHAR_W * max((len(label) for label in labels), default=0)) + 12)
    plot_w = CHART_W - 220 - RIGHT - 40
    width = label_w + plot_w + RIGHT + 40
    height = TOP + row * len(labels) + 24
    parts = []
    for index, (label, share) in enumerate(zip(labels, shares)):
        y = TOP + index * row
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 12}" text-anchor="end">{html.escape(label)}</text>'
            f'<rect x="{label_w}" y="{y + 2}" width="{plot_w}" height="{row - 4}" fill="#eee"/>'
            f'<rect x="{label_w}" y="{y + 2}" width="{plot_w * share:.1f}" height="{row - 4}" fill="#2a6fb0">'
            f"<title>{html.escape(label)}: {share:.1%}</title></rect>"
            f'<text x="{label_w + plot_w + 4}" y="{y + 12}">{share:.0%}</text>'
        )
    return _svg(title, parts, width=width, height=height)


def svg_lines(
    series: list[tuple[str, list[float], list[float | None]]],
    *,
    title: str,
    x_label: str,
    y_label: str,
    y_max: float | None = None,
    x_range: tuple[float, float] | None = None,
) -> str:
    """Several lines on one pair of axes (x: steps), one colour each, named in a legend below the frame.
    A None y is a gap; few points are also marked, so a single one shows. `y_max` fixes the axis's top
    (accuracies: 1; two charts to compare: the same top), else it ends on the tick above the largest y;
    `x_range` likewise fixes the x axis (charts side by side: the same steps)."""
    # a series keeps its colour by its place in `series`, drawn or not: the same name, the same colour in
    # charts drawn side by side
    drawn = [
        (
            name,
            SERIES_COLOURS[index % len(SERIES_COLOURS)],
            [(x, y) for x, y in zip(xs, ys) if y is not None and math.isfinite(y)],
        )
        for index, (name, xs, ys) in enumerate(series)
    ]
    drawn = [entry for entry in drawn if entry[2]]
    legend_h = 18
    if not drawn:
        return _svg(title, ['<text x="50%" y="50%" text-anchor="middle">no data</text>'])
    all_x = [x for _, _, points in drawn for x, _ in points]
    top = max(y for _, _, points in drawn for _, y in points)
    x_axis = _Axis(*(x_range or (min(all_x), max(all_x))), integer=True)
    y_axis = _Axis(0, y_max, headroom=False) if y_max is not None else _Axis(0, top, headroom=True)
    plot_w, plot_h = CHART_W - LEFT - RIGHT, CHART_H - TOP - BOTTOM
    parts = _axes(x_axis, y_axis, x_label, y_label)
    legend_x, legend_row = LEFT, 0
    for name, colour, points in drawn:
        xy = [(LEFT + plot_w * x_axis.frac(x), TOP + plot_h * (1 - y_axis.frac(y))) for x, y in points]
        parts.append(
            f'<polyline points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in xy)}" fill="none" '
            f'stroke="{colour}" stroke-width="1.5"><title>{html.escape(name)}</title></polyline>'
        )
        if len(xy) <= MARKED_POINTS:
            parts += [
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour}"><title>{html.escape(name)} at '
                f"{fmt_number(px)}: {format_number(py)}</title></circle>"
                for (x, y), (px, py) in zip(xy, points)
            ]
        entry_w = 28 + LABEL_CHAR_W * len(name)
        if legend_x > LEFT and legend_x + entry_w > CHART_W - RIGHT:  # the legend wraps, never overflows
            legend_x, legend_row = LEFT, legend_row + 1
        legend_y = CHART_H + legend_h * (legend_row + 0.5)
        parts.append(
            f'<line x1="{legend_x}" x2="{legend_x + 16}" y1="{legend_y - 4}" y2="{legend_y - 4}" '
            f'stroke="{colour}" stroke-width="3"/><text x="{legend_x + 20}" y="{legend_y}">'
            f"{html.escape(name)}</text>"
        )
        legend_x += entry_w
    return _svg(title, parts, height=CHART_H + legend_h * (legend_row + 1))
