"""`diag analyze --format html`: the report as one self-contained page (no network: inline CSS and
SVG, no scripts, fonts or images from elsewhere), for a CI artifact or a manager's inbox.

Charts are hand-written SVG: the page needs two kinds (bars and a grid of cells), which are a few
rects each; a plotting library would be a heavy core dependency (matplotlib) or reference
scripts online by default (pygal's tooltips), and neither draws the heatmap as we need it.
"""

from __future__ import annotations

import statistics
from typing import Any

import duckdb

from diag.attribution.ledger import BUCKETS
from diag.attribution.what_if import what_if_words
from diag.engine.run import Analysis
from diag.knowledge import kernels
from diag.outputs.evidence import resolve
from diag.outputs.report import MESH_HEADER, UNSPLIT, _header, _of, _waterfall, mesh_rows, unsplit_points
from diag.runtime.durations import flop_count, number, percent, signed_percent
from diag.runtime.sanitize import html_text

# One colour per bucket (Okabe–Ito-like, distinguishable in colour-blindness simulations).
COLOURS = {
    "model_compute": "#009E73", "recompute": "#56B4E9", "thin_gemm": "#0072B2", "gemm_inefficiency": "#3b5b92",
    "non_matmul": "#999999", "exposed_comm": "#D55E00", "straggler": "#CC79A7", "pipeline_bubble": "#E69F00",
    "dataloader": "#F0E442", "host_bound": "#8c564b", "idle_other": "#c7c7c7", "memcpy": "#17becf",
}
# A heatmap of more cells than this would make a page browsers crawl over: the slowest ranks and
# the last steps are shown, and the page says so.
MAX_HEAT_RANKS = 128
MAX_HEAT_STEPS = 100
TOP_KERNELS = 15
MAX_EVIDENCE = 12
# Evidence lines carry rank, step and time beside the name: a shorter name keeps each on one line.
EVIDENCE_NAME_WIDTH = 60
# The step-time heatmap's full scale: a rank-step this much slower than the median is the darkest
# red. A run's own min-to-max would paint a 0.7% spread as saturated; 10% is a straggler worth a look.
HEAT_FULL_SCALE = 0.10

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1100px;color:#222;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.kpi{display:flex;gap:24px;flex-wrap:wrap;margin:12px 0}.kpi div{background:#f5f7fa;border-radius:6px;padding:8px 14px}
.kpi b{display:block;font-size:20px}table{border-collapse:collapse;width:100%}td,th{padding:4px 8px;text-align:left;
border-bottom:1px solid #eee;vertical-align:top}th{background:#fafafa}td.n{text-align:right;font-variant-numeric:tabular-nums}
.finding{border-left:4px solid #D55E00;padding:6px 12px;margin:10px 0;background:#fffaf6}.finding.low,.finding.info{border-color:#999}
.finding.medium{border-color:#E69F00}.fail{color:#b00020;font-weight:600}.pass{color:#007a4d;font-weight:600}code{font-size:12px;word-break:break-all}.muted{color:#666}svg{max-width:100%;height:auto}
ul.evidence{margin:0 0 6px;padding-left:20px;font-size:13px;color:#444}.legend span{display:inline-block;margin-right:12px}.legend i{display:inline-block;width:10px;height:10px;margin-right:4px}
"""


def render_html(report: dict[str, Any], a: Analysis, con: duckdb.DuckDBPyConnection, title: str) -> str:
    h = _header(report)
    windows = [lg.window_s for lg in a.run.ledgers]
    parts = [
        f'<p class="muted">{html_text(h[0])}</p>',
        _kpis(report, windows),
        "<h2>Where the step went</h2>",
        '<p class="muted">MFU points from the dense peak down to the achieved MFU (mean over ranks and steps).</p>',
        waterfall_svg(report),
        "<h2>Ranks × steps</h2>", _heatmaps(a),
        "<h2>Findings</h2>", _findings(report, con),
        *_mesh(report),
        "<h2>Top kernels by time</h2>", _kernels(con),
    ]
    if report["notes"]:
        parts += ["<h2>Notes</h2><ul>", *(f"<li>{html_text(n)}</li>" for n in report["notes"]), "</ul>"]
    return page(f"diag report: {title}", parts)


def page(title: str, body: list[str]) -> str:
    """A whole page: the title as <title> and <h1>, then `body` (HTML), with the inline stylesheet."""
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html_text(title)}</title><style>{CSS}</style></head><body>", f"<h1>{html_text(title)}</h1>",
        *body, "</body></html>",
    ]) + "\n"


def table(header: list[str], rows: list[list[str]], numeric: frozenset[int] = frozenset()) -> str:
    """A table of text cells (escaped here); columns in `numeric` right-aligned."""
    head = "".join(f"<th>{html_text(h)}</th>" for h in header)
    num = ' class="n"'
    body = "".join("<tr>" + "".join(f"<td{num if i in numeric else ''}>{html_text(c)}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _kpis(r: dict[str, Any], windows: list[float]) -> str:
    d = r["device"]
    cells = [
        ("MFU", percent(r["mfu"])), ("HFU", percent(r["hfu"])),
        ("part", d["name"] or "unknown"),
        ("peak", "unknown" if d["peak_tflops"] is None else f"{number(d['peak_tflops'])} TFLOP/s {d['dtype']}"),
    ]
    f = r.get("flops_per_step")
    if r.get("timeline") == "host" and f and f["executed"]:   # as the text's header: MFU's figures by hand
        model = "unknown" if f["model"] is None else flop_count(f["model"])
        cells.append(("FLOPs/step: model, executed", f"{model}, {flop_count(f['executed'])}"))
    if windows:
        cells.append(("step time (median)", f"{statistics.median(windows) * 1e3:.2f} ms"))
        cells.append(("spread over rank-steps", f"{min(windows) * 1e3:.2f} – {max(windows) * 1e3:.2f} ms"))
    return '<div class="kpi">' + "".join(f"<div>{html_text(k)}<b>{html_text(v)}</b></div>" for k, v in cells) + "</div>"


def waterfall_svg(r: dict[str, Any]) -> str:
    """Horizontal cascade: the peak (100), each loss as a bar hanging from what is left, the MFU."""
    rows: list[tuple[str, float, float, str]] = [("peak", 0.0, 100.0, "#444")]
    left = 100.0
    for b, p in _waterfall(r):
        rows.append((f"− {b}", left - p, left, COLOURS[b]))
        left -= p
    if (unsplit := unsplit_points(r)) is not None:
        # Not a loss: compute whose model FLOPs are unknown, left standing above the compute bar.
        rows.append((f"? {UNSPLIT}", left - unsplit, left, COLOURS["gemm_inefficiency"]))
    mfu = r["ledger"]["model_compute"] * 100 if r["mfu"] is not None else None
    # The MFU bar is model_compute itself: losses under 0.05 points are not drawn above it.
    rows.append(("= MFU", 0.0, mfu, COLOURS["model_compute"]) if mfu is not None else
                ("= compute (MFU unknown)", 0.0, max(left, 0.0), COLOURS["model_compute"]))
    label_w, bar_w, row_h = 190, 640, 22
    height = row_h * len(rows) + 24
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + bar_w + 70}" height="{height}" '
           f'role="img" aria-label="MFU waterfall">']
    for i, (label, lo, hi, colour) in enumerate(rows):
        y = i * row_h + 4
        x0 = label_w + bar_w * lo / 100
        w = max(bar_w * (hi - lo) / 100, 1.0)
        out.append(f'<text x="{label_w - 8}" y="{y + 14}" text-anchor="end" font-size="12">{html_text(label)}</text>')
        out.append(f'<rect x="{x0:.1f}" y="{y}" width="{w:.1f}" height="{row_h - 6}" fill="{colour}">'
                   f"<title>{html_text(label)}: {hi - lo:.1f} points</title></rect>")
        out.append(f'<text x="{x0 + w + 4:.1f}" y="{y + 14}" font-size="12">{hi - lo:.1f}</text>')
    axis_y = row_h * len(rows) + 8
    for t in range(0, 101, 20):
        x = label_w + bar_w * t / 100
        out.append(f'<line x1="{x:.1f}" y1="4" x2="{x:.1f}" y2="{axis_y}" stroke="#ddd" stroke-width="1"/>')
        out.append(f'<text x="{x:.1f}" y="{axis_y + 12}" text-anchor="middle" font-size="10" fill="#666">{t}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _heatmaps(a: Analysis) -> str:
    cells = {(lg.rank, lg.step): lg for lg in a.run.ledgers}
    ranks = sorted({r for r, _ in cells})
    steps = sorted({s for _, s in cells})
    note = ""
    if len(ranks) > MAX_HEAT_RANKS:
        mean = {r: statistics.fmean(lg.window_s for (rr, _), lg in cells.items() if rr == r) for r in ranks}
        ranks = sorted(sorted(ranks, key=lambda r: -mean[r])[:MAX_HEAT_RANKS])
        note += f"the {MAX_HEAT_RANKS} ranks with the longest mean step time; "
    if len(steps) > MAX_HEAT_STEPS:
        steps = steps[-MAX_HEAT_STEPS:]
        note += f"the last {MAX_HEAT_STEPS} steps; "
    if not cells:
        return "<p>No steps.</p>"
    times = [lg.window_s for lg in cells.values()]
    lo, hi, median = min(times), max(times), statistics.median(times)

    def shade(lg: Any) -> tuple[str, str]:
        above = lg.window_s / median - 1 if median > 0 else 0.0
        f = min(max(above / HEAT_FULL_SCALE, 0.0), 1.0)
        # white (the median or faster) → dark red (HEAT_FULL_SCALE or more above it)
        g = round(235 - 200 * f)
        return f"rgb(250,{g},{g})", (f"rank {lg.rank} step {lg.step}: {lg.window_s * 1e3:.2f} ms "
                                     f"({signed_percent(above)} vs the median)")

    def worst(lg: Any) -> tuple[str, str]:
        b = max((b for b in BUCKETS if b != "model_compute"), key=lambda b: lg.buckets[b])
        return COLOURS[b], f"rank {lg.rank} step {lg.step}: {b} {lg.fractions()[b] * 100:.1f}% of the step"

    used = sorted({max((b for b in BUCKETS if b != "model_compute"), key=lambda b: lg.buckets[b])
                   for lg in cells.values()}, key=BUCKETS.index)
    legend = '<p class="legend">' + "".join(f'<span><i style="background:{COLOURS[b]}"></i>{html_text(b)}</span>'
                                           for b in used) + "</p>"
    return (
        (f'<p class="muted">Showing {html_text(note.rstrip("; "))}.</p>' if note else "")
        + f'<p>Step time against the median, {median * 1e3:.2f} ms: white at or below it, dark red '
          f'{HEAT_FULL_SCALE:.0%} or more above it. This run: {lo * 1e3:.2f} ms to {hi * 1e3:.2f} ms '
          f'({signed_percent(lo / median - 1 if median else 0.0)} to {signed_percent(hi / median - 1 if median else 0.0)}).</p>'
        + heatmap_svg(ranks, steps, cells, shade, "step time by rank and step")
        + "<p>The bucket that lost the most time in each step (besides model compute):</p>" + legend
        + heatmap_svg(ranks, steps, cells, worst, "worst bucket by rank and step")
    )


def heatmap_svg(ranks: list[int], steps: list[int], cells: dict[tuple[int, int], Any], paint: Any, label: str) -> str:
    """One cell per (rank, step): `paint(cell)` gives its fill and tooltip; ranks down, steps across."""
    cw = max(4, min(28, 900 // max(len(steps), 1)))
    ch = max(3, min(18, 600 // max(len(ranks), 1)))
    left, top = 70, 18
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + cw * len(steps) + 10}" '
           f'height="{top + ch * len(ranks) + 10}" role="img" aria-label="{html_text(label)}">',
           f'<text x="{left}" y="12" font-size="11" fill="#666">steps {steps[0]}–{steps[-1]} →</text>']
    label_every = max(1, 12 // ch)
    for i, r in enumerate(ranks):
        y = top + i * ch
        if i % label_every == 0:
            out.append(f'<text x="{left - 6}" y="{y + ch - 1}" text-anchor="end" font-size="{min(11, max(ch, 8))}">'
                       f"rank {r}</text>")
        for j, s in enumerate(steps):
            lg = cells.get((r, s))
            if lg is None:
                continue
            fill, tip = paint(lg)
            out.append(f'<rect x="{left + j * cw}" y="{y}" width="{cw - 1}" height="{ch - 1 if ch > 3 else ch}" '
                       f'fill="{fill}"><title>{html_text(tip)}</title></rect>')
    out.append("</svg>")
    return "\n".join(out)


def _findings(r: dict[str, Any], con: duckdb.DuckDBPyConnection) -> str:
    if not r["findings"]:
        return "<p>No findings above their thresholds.</p>"
    out = []
    for f in r["findings"]:
        ids = list(dict.fromkeys(f["evidence"]))   # a step two gaps share is one line
        ev = ids[:MAX_EVIDENCE]
        more = f"<li>… and {len(ids) - len(ev)} more</li>" if len(ids) > len(ev) else ""
        ranks = ", ".join(map(str, f["ranks"][:32])) + (" …" if len(f["ranks"]) > 32 else "")
        out.append(
            f'<div class="finding {html_text(f["severity"])}"><b>{html_text(f["code"])} {html_text(f["slug"])}</b> '
            f'<span class="muted">[{html_text(f["severity"])}] {f["mfu_points"]:.1f} MFU points{html_text(_of(f))}'
            + (f" · MFU {percent(f['what_if_mfu'])} {what_if_words(f['code'])}"
               if f["what_if_mfu"] is not None and f["lost_fraction"]
               else "")
            + f'</span><p>{html_text(f["summary"])}</p><p><b>What to do:</b> {html_text(f["advice"])}</p>'
            + (f'<p class="muted">Ranks: {html_text(ranks)}</p>' if ranks else "")
            + (f'<p class="muted">Evidence:</p><ul class="evidence">{"".join(_evidence(con, e) for e in ev)}{more}</ul>'
               if ev else "")
            + "</div>"
        )
    return "\n".join(out)


def _evidence(con: duckdb.DuckDBPyConnection, evidence_id: str) -> str:
    """One piece of evidence as people name it (rank, step, the kernel or collective, its time), the
    kernel's name shortened at a template boundary with the whole of it, and the id, on hover."""
    place = resolve(con, evidence_id)
    label = place.label
    if place.name:
        label = label.replace(place.name, kernels.short(place.name, EVIDENCE_NAME_WIDTH))
    return f'<li title="{html_text(evidence_id)}: {html_text(place.label)}">{html_text(label)}</li>'


def _mesh(r: dict[str, Any]) -> list[str]:
    """The parallel layout's groups (report.mesh_rows), where the trace names any."""
    rows = mesh_rows(r)
    if not rows:
        return []
    p = r["parallelism"]
    dims = " × ".join(f"{d} {n}" for d, n in p["dims"].items() if n > 1) or "one rank per group"
    return ["<h2>The mesh</h2>",
            f'<p class="muted">{html_text(dims)}; sharding {html_text(p["sharding"] or "unknown")}; '
            f'certain: {html_text(", ".join(p["certain"]) or "none")}. {html_text(p["how"])}</p>',
            table(MESH_HEADER, rows, frozenset({2, 3, 4, 6}))]


def top_kernels(con: duckdb.DuckDBPyConnection, n: int = TOP_KERNELS) -> list[tuple[Any, ...]]:
    """(name, class, calls, total s, share of all GPU activity time, TFLOP/s achieved or None) over all
    ranks: achieved = FLOPs from op shapes ÷ the time of the kernels that have them."""
    return con.execute(
        """
        SELECT name, any_value(kclass), count(*), sum(end_ns - ts_ns) * 1e-9,
               sum(end_ns - ts_ns) / (SELECT sum(end_ns - ts_ns) FROM activities),
               sum(flops) FILTER (WHERE flops > 0) / nullif(sum(end_ns - ts_ns) FILTER (WHERE flops > 0), 0) * 1e-3
        FROM activities GROUP BY name ORDER BY sum(end_ns - ts_ns) DESC, name LIMIT ?
        """, [n]).fetchall()


def _kernels(con: duckdb.DuckDBPyConnection) -> str:
    rows = top_kernels(con)
    if not rows:
        return "<p>No GPU activity.</p>"
    out = ["<table><tr><th>kernel</th><th>class</th><th>calls</th><th>total s</th><th>share</th>"
           "<th>TFLOP/s achieved</th></tr>"]
    for name, kclass, calls, secs, share, tflops in rows:
        out.append(f"<tr><td><code title=\"{html_text(name or '')}\">{html_text(kernels.short(name or ''))}</code></td>"
                   f"<td>{html_text(kclass or '')}</td>"
                   f'<td class="n">{calls}</td><td class="n">{secs:.4f}</td><td class="n">{share * 100:.1f}%</td>'
                   f'<td class="n">{"" if tflops is None else f"{tflops:.1f}"}</td></tr>')
    out.append("</table>")
    return "\n".join(out)
