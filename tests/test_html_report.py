"""`diag analyze --format html`: one self-contained page. Always on: the HTML is well formed, every
SVG parses as XML, nothing is fetched from the network, the charts carry the report's numbers.
With Debian's chromium: the page renders headless (a screenshot) and its DOM holds the sections."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import duckdb
import pytest
from helpers import run_diag

from diag.knowledge import kernels
from diag.runtime.durations import signed_percent
from fixtures.generate import generate

pytestmark = pytest.mark.xdist_group("html_report")

VOID = {"meta", "br", "hr", "img", "input", "link", "area", "base", "col", "embed", "source", "track", "wbr"}
SVG_NS = "http://www.w3.org/2000/svg"


class StrictTags(HTMLParser):
    """Every element closed in order (void elements excepted), no scripts, no external references."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "link", "iframe", "img", "object"):
            self.errors.append(f"<{tag}> in a self-contained page")
        for k, v in attrs:
            if k in ("src", "href") or (v and re.search(r"(https?:)?//", v) and v != SVG_NS):
                self.errors.append(f"external reference {k}={v!r}")
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.stack.pop()

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()


def check_page(text: str) -> list[ET.Element]:
    assert text.startswith("<!DOCTYPE html>")
    p = StrictTags()
    p.feed(text)
    p.close()
    assert not p.errors and not p.stack, (p.errors, p.stack)
    assert "url(" not in text and "@import" not in text and "@font-face" not in text
    svgs = re.findall(r"<svg .*?</svg>", text, flags=re.S)
    return [ET.fromstring(s) for s in svgs]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, object]]:
    src = tmp_path_factory.mktemp("demo")
    generate("demo", src)
    out = tmp_path_factory.mktemp("out")
    db = out / "run.duckdb"
    r = run_diag("analyze", str(src), "--db", str(db), "--format", "html", "--out", str(out / "report.html"))
    assert r.returncode == 0, r.stderr
    report = json.loads(run_diag("analyze", str(db), "--format", "json").stdout)
    return out / "report.html", db, report


def test_page_is_self_contained_and_carries_the_numbers(demo: tuple[Path, Path, dict]) -> None:  # type: ignore[type-arg]
    page, db, report = demo
    text = page.read_text()
    svgs = check_page(text)
    assert len(svgs) == 3   # waterfall, step-time heatmap, worst-bucket heatmap
    waterfall, heat_time, heat_worst = svgs
    tips = [t.text or "" for t in waterfall.iter(f"{{{SVG_NS}}}title")]
    led = report["ledger"]
    for b in ("exposed_comm", "straggler", "dataloader"):
        assert f"− {b}: {led[b] * 100:.1f} points" in tips
    assert f"= MFU: {led['model_compute'] * 100:.1f} points" in tips
    cells = len(report["ranks"]) * report["steps"]
    assert len(list(heat_time.iter(f"{{{SVG_NS}}}rect"))) == cells == len(list(heat_worst.iter(f"{{{SVG_NS}}}rect")))
    assert f"MFU<b>{report['mfu'] * 100:.1f}%</b>" in text
    for f in report["findings"]:
        assert f["code"] in text and f["advice"].split(":")[0] in text


def test_top_kernel_tflops_derived_by_hand(demo: tuple[Path, Path, dict]) -> None:  # type: ignore[type-arg]
    """The first row of the kernel table: the kernel with the most time; its TFLOP/s = its FLOPs ÷
    the time of its calls that have FLOPs, summed here row by row from the store."""
    page, db, _ = demo
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT name, ts_ns, end_ns, flops FROM activities").fetchall()
    con.close()
    total: dict[str, int] = {}
    for name, ts, end, _ in rows:
        total[name] = total.get(name, 0) + end - ts
    top = max(total, key=lambda n: (total[n], n))
    mine = [(end - ts, fl) for name, ts, end, fl in rows if name == top and fl and fl > 0]
    row = re.search(r'<tr><td><code title="(.*?)">(.*?)</code>.*?</tr>', page.read_text().split("Top kernels")[1],
                    flags=re.S)
    assert row is not None and html.unescape(row[1]) == top      # the whole name on hover
    assert html.unescape(row[2]) == kernels.short(top)             # cut at a template boundary in the cell
    cells = re.findall(r'<td class="n">(.*?)</td>', row[0])
    assert cells[1] == f"{total[top] * 1e-9:.4f}"
    if mine:
        assert cells[3] == f"{sum(f for _, f in mine) / sum(d for d, _ in mine) * 1e-3:.1f}"


def test_chromium_renders_the_page(demo: tuple[Path, Path, dict], tmp_path: Path) -> None:  # type: ignore[type-arg]
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium; CI installs it)")
    page, _, _ = demo
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1200,2400",
             "--host-resolver-rules=MAP * ~NOTFOUND"]
    shot = tmp_path / "page.png"
    subprocess.run([*flags, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120, check=True)
    assert shot.stat().st_size > 10_000
    dom = subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    for section in ("Where the step went", "Ranks × steps", "Findings", "Top kernels by time"):
        assert section in dom
    assert dom.count("<svg") == 3


def test_evidence_reads_as_rank_step_and_name(demo: tuple[Path, Path, dict]) -> None:  # type: ignore[type-arg]
    """Issue 39: a finding's evidence as people name it (the collective, its step, the late rank and
    the wait), its internal id only on hover; each id once."""
    page, _, report = demo
    text = page.read_text()
    shown = re.sub(r'title="[^"]*"', "", text)
    assert not re.search(r">[^<]*\b(act|coll|step):[\w|#]+:", shown), "an internal id in the visible text"
    late = next(f for f in report["findings"] if f["code"] == "MFU005")
    block = text.split(f"{late['code']} {late['slug']}")[1].split('<div class="finding')[0]
    items = re.findall(r"<li title=\"(.*?)\">(.*?)</li>", block)
    assert [html.unescape(t).split(": ")[0] for t, _ in items] == list(dict.fromkeys(late["evidence"]))[:12]
    assert all(re.match(r"allreduce on .*, step \d+: last rank 5, others waited up to \d+\.\d\d ms", html.unescape(v))
               for _, v in items), items


def test_step_heatmap_is_scaled_to_the_median(demo: tuple[Path, Path, dict]) -> None:  # type: ignore[type-arg]
    """The demo's step times spread 0.7%: against the median and a 10% full scale, the slowest cell is
    pale (g ≥ 235 − 200 × 0.7/10), not saturated red, and the legend says the scale and this run's range."""
    page, _, report = demo
    text = page.read_text()
    spread = report["step_time_spread_s"]
    median = spread["median"]
    worst = spread["max"] / median - 1
    assert worst < 0.01
    heat = re.findall(r"<svg .*?</svg>", text, flags=re.S)[1]
    greens = [int(g) for g in re.findall(r'fill="rgb\(250,(\d+),\d+\)"', heat)]
    assert min(greens) == round(235 - 200 * min(worst / 0.10, 1.0)) and min(greens) > 200
    low = spread["min"] / median - 1
    assert f"Step time against the median, {median * 1e3:.2f} ms: white at or below it, dark red 10% or more above it" \
        in text and f"({signed_percent(low)} to {signed_percent(worst)})" in text
