"""Growth plots for bench/bench.py: one SVG per measure (wall time, CPU time,
peak memory against extra processes; wall time and memory against hosts),
log-log, one solid line per tool, the targets ("anchors") dashed.

    import growth
    growth.add("time", "gpureap status --json", 5000, 82.0)
    growth.anchor("time", "target: at most nvidia-smi's", 5000, 33.0)
    growth.draw(folder, "sim", "this machine, simulated driver")

Written by bench/bench.py into docs/bench/ (or beside its --out file):
growth-time-SUFFIX.svg, growth-cpu-SUFFIX.svg, growth-memory-SUFFIX.svg,
fleet-time-SUFFIX.svg, fleet-memory-SUFFIX.svg. Each is drawn from the very
figures the run's report prints; a measure with fewer than two points is not drawn.
"""

import math
from pathlib import Path

MEASURES = {
    "time": ("growth-time", "Wall time against extra processes", "extra processes", "median wall time", " ms"),
    "cpu": ("growth-cpu", "CPU time (user + system) against extra processes", "extra processes",
            "median CPU time", " ms"),
    "memory": ("growth-memory", "Peak resident memory against extra processes", "extra processes",
               "peak RSS", " MiB"),
    "fleet-time": ("fleet-time", "status -H: wall time against hosts", "hosts", "median wall time", " ms"),
    "fleet-memory": ("fleet-memory", "status -H: gpureap's peak resident memory against hosts", "hosts",
                     "peak RSS", " MiB"),
}
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
SERIES = {measure: {} for measure in MEASURES}
ANCHORS = {measure: {} for measure in MEASURES}


def add(measure, name, x, y):
    SERIES[measure].setdefault(name, []).append((x, y))


def anchor(measure, name, x, y):
    """A target: drawn dashed, in grey, with its name in the legend."""
    ANCHORS[measure].setdefault(name, []).append((x, y))


def escape(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def chart(title, x_label, y_label, unit, series, anchors):
    """An SVG line chart, log-log axes, series solid and anchors dashed."""
    width, height = 820, 440
    left, right, top, bottom = 90, 300, 40, 55
    every = list(series.values()) + list(anchors.values())
    xs = [x for points in every for x, _ in points]
    ys = [y for points in every for _, y in points if y > 0]
    x_lo, x_hi = min(xs) / 1.5, max(xs) * 1.5
    y_lo, y_hi = 10 ** math.floor(math.log10(min(ys))), 10 ** math.ceil(math.log10(max(ys)))
    if y_hi / y_lo < 100:
        y_hi = y_lo * 100

    def px(x):
        return left + (math.log10(x) - math.log10(x_lo)) / (math.log10(x_hi) - math.log10(x_lo)) * (width - left - right)

    def py(y):
        return height - bottom - (math.log10(max(y, y_lo)) - math.log10(y_lo)) / (math.log10(y_hi) - math.log10(y_lo)) * (
            height - top - bottom)

    def label(value, suffix=""):
        return f"{value:,.0f}{suffix}" if value >= 1 else f"{value:g}{suffix}"

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2:.0f}" y="22" text-anchor="middle" font-size="14">{escape(title)}</text>']
    for value in sorted(set(xs)):
        x = px(value)
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{height - bottom}" stroke="#ddd"/>')
        out.append(f'<text x="{x:.1f}" y="{height - bottom + 16}" text-anchor="middle">{label(value)}</text>')
    decade = y_lo
    while decade <= y_hi:
        for step in (1, 2, 5):
            value = decade * step
            if value > y_hi:
                break
            y = py(value)
            out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" stroke="#ddd"/>')
            out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{label(value, unit)}</text>')
        decade *= 10
    out.append(f'<rect x="{left}" y="{top}" width="{width - left - right}" height="{height - top - bottom}" '
               'fill="none" stroke="#333"/>')
    out.append(f'<text x="{(left + width - right) / 2:.0f}" y="{height - 14}" text-anchor="middle">'
               f'{escape(x_label)} (log scale)</text>')
    out.append(f'<text transform="translate(18 {(top + height - bottom) / 2:.0f}) rotate(-90)" '
               f'text-anchor="middle">{escape(y_label)} (log scale)</text>')
    entries = [(name, points, PALETTE[number % len(PALETTE)], "")
               for number, (name, points) in enumerate(series.items())]
    entries += [(name, points, "#555", ' stroke-dasharray="6 4"') for name, points in anchors.items()]
    for number, (name, points, colour, dash) in enumerate(entries):
        points = sorted(points)
        if len(points) == 1:
            # A single-point anchor (a fixed figure): a horizontal line across the plot.
            points = [(x_lo, points[0][1]), (x_hi, points[0][1])]
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        if not dash:
            for x, y in points:
                out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" fill="{colour}">'
                           f'<title>{escape(name)}: {y:,.1f}{unit} at {x:,}</title></circle>')
        legend_y = top + 16 + 20 * number
        out.append(f'<line x1="{width - right + 12}" y1="{legend_y - 4}" x2="{width - right + 32}" '
                   f'y2="{legend_y - 4}" stroke="{colour}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{width - right + 38}" y="{legend_y}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def draw(folder, suffix, where):
    """Writes each measure with two points or more; returns the file names written."""
    written = []
    for measure, (stem, title, x_label, y_label, unit) in MEASURES.items():
        series = {name: points for name, points in SERIES[measure].items() if points}
        if not any(len(points) >= 2 for points in series.values()):
            continue
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        name = f"{stem}-{suffix}.svg"
        (folder / name).write_text(chart(f"{title} ({where})", x_label, y_label, unit, series, ANCHORS[measure]))
        written.append(name)
    return written
