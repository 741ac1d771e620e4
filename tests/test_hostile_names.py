"""Hostile names through every sink (issue 40, items 3, 5 and 10): a kernel, op, device or file name
is whatever the traced program wrote, and no sink may act on it.

Each name of the corpus is put where names reach the outputs (a finding's summary and advice, a
note, the device's name, the run's path) of a real report, and each sink is rendered twice, once
with the name and once with a plain word in its place: the two must have the same shape (lines,
Markdown and HTML tags, JUnit test cases), no control character may reach a terminal, no line may
begin a GitHub workflow command, the JUnit file must parse, and the TUI must show the name as text.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import unicodedata
import xml.etree.ElementTree as ET
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from helpers import run_diag
from rich.text import Text
from textual.app import App, ComposeResult
from textual.widgets import DataTable, Static

from diag.api import analyze_path
from diag.ingest.pipeline import IngestOptions
from diag.outputs import gate, gate_output
from diag.outputs.report import render_markdown, render_text, to_json
from diag.runtime.sanitize import terminal
from fixtures.generate import generate
from tui.views.base import name_text
from tui.views.findings import detail
from tui.views.overview import headline

Report = dict[str, Any]

CORPUS = (
    "\n::error file=x,title=pwned::owned\n::add-mask::secret",     # workflow commands on lines of their own
    "::error::a name that begins a line", "  ::warning::after blanks", "\r::notice::after a CR",
    "%0A::error::percent-encoded", "::stop-commands::tok",
    "\x1b]52;c;cHduZWQ=\x07", "\x1b[2J\x1b[H", "\x9b2J", "\x00nul \x08bs \x7fdel \x85nel",  # clipboard, clear screen
    "\u202eevil\u2066", "\u2028line\u2029para", "lone \ud800 surrogate", "bytes \udcff not UTF-8",
    "[/]", "[link=https://x.example]click[/link]", "[bold red]x[/]", "\\[b]",               # Rich / Textual markup
    "# heading", "<details><summary>x</summary>", "<script>alert(1)</script>", "&lt;b&gt; &amp;",
    "| a | b |", "*em* _u_ `code` ~~s~~ $x^2$", "[x](https://x.example) ![i](https://x.example/i.png)",
    "1. list", "- item", "> quote", "===", "\ufffe\uffff",
)
PLAIN = "NAME"


# ------------------------------------------------------------------------------------ the reports

@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    root = tmp_path_factory.mktemp("hostile")
    generate("healthy", root / "healthy", world_size=2)
    _, r = analyze_path(str(root / "healthy"), ingest_opts=IngestOptions(jobs=1), warn=False)
    doc: Report = json.loads(to_json(r))
    return doc


def named(report: Report, name: str) -> Report:
    """The report with `name` wherever a report carries names, and a new finding whose summary holds it."""
    r = copy.deepcopy(report)
    r["device"]["name"] = f"{name} GPU"
    r["notes"] = [*r["notes"], f"model description from {name}/model.toml"]
    finding = {"code": "MFU008", "slug": "kernel-inefficiency", "severity": "high", "bucket": "non_matmul",
               "lost_fraction": 0.12, "recoverable_fraction": 0.05, "lost_s": 0.001, "mfu_points": 12.0,
               "what_if_mfu": None, "what_if_mfu_naive": None, "ranks": [0, 1], "steps": [1], "evidence": [],
               "summary": f"non-matmul kernels waste 12% of the step; worst: {name}", "advice": f"fuse {name}",
               "details": {}}
    r["findings"] = [*r["findings"], finding]
    return r


def gate_result(report: Report, name: str) -> gate.GateResult:
    base = gate.Run(f"base-{name}.json", gate.check_report(report, "base.json"))
    cur = gate.Run(f"{name}.json", gate.check_report(named(report, name), "cur.json"))
    return gate.compare(base, cur, gate.Budget(), (f"device {name} vs the baseline's",))


# ------------------------------------------------------------------------------------ the checks

def assert_terminal_safe(text: str, commands: bool = False) -> None:
    """Nothing a terminal or a CI runner acts on: no control or format character but the newlines,
    and no line that a runner reads as a workflow command (`::`, after leading blanks) unless the
    sink writes `commands`."""
    bad = [c for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp", "Cn")]
    assert not bad, f"raw {bad!r}"
    assert commands or not [line for line in text.split("\n") if line.lstrip().startswith("::")]


def html_tags(page: str) -> list[str]:
    tags: list[str] = []

    class Collect(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            tags.append(tag + "".join(sorted(f" {k}" for k, _ in attrs)))

        def handle_endtag(self, tag: str) -> None:
            tags.append("/" + tag)

    Collect().feed(page)
    return tags


def markdown_tags(text: str) -> list[str]:
    markdown_it = pytest.importorskip("markdown_it")
    md = markdown_it.MarkdownIt("commonmark").enable(["table", "strikethrough"])
    return html_tags(md.render(text))


Sink = Callable[[Report, str], str]
SINKS: dict[str, Sink] = {
    "report text": lambda r, n: render_text(named(r, n)),
    "report markdown": lambda r, n: render_markdown(named(r, n)),
    "gate text": lambda r, n: gate_output.render_text(gate_result(r, n)),
    "gate markdown (the step summary)": lambda r, n: gate_output.render_markdown(gate_result(r, n)),
    "gate html": lambda r, n: gate_output.render_html(gate_result(r, n)),
    "gate junit": lambda r, n: gate_output.render_junit(gate_result(r, n)),
    "gate annotations": lambda r, n: "\n".join(gate_output.github_annotations(gate_result(r, n))),
}


@pytest.mark.parametrize("sink", SINKS)
def test_every_sink_leaves_hostile_names_inert(report: Report, sink: str) -> None:
    render = SINKS[sink]
    plain = render(report, PLAIN)
    for name in CORPUS:
        out = render(report, name)
        assert_terminal_safe(out, commands="annotations" in sink)
        assert len(out.split("\n")) == len(plain.split("\n")), name
        if "markdown" in sink:
            assert markdown_tags(out) == markdown_tags(plain), name
        if "html" in sink:
            assert html_tags(out) == html_tags(plain), name
        if "junit" in sink:
            root = ET.fromstring(out.split("\n", 1)[1])     # parses: no character XML 1.0 forbids
            assert len(root.findall(".//testcase")) == len(ET.fromstring(plain.split("\n", 1)[1]).findall(".//testcase"))
        if "annotations" in sink:
            lines = out.split("\n")
            assert all(re.match(r"::(error|warning) title=[^:]*::", line) for line in lines), name
            assert all("\r" not in line for line in lines)


def test_the_name_is_still_there_to_read(report: Report) -> None:
    # Escaped, not dropped: the reader sees what the trace holds.
    name = "\x1b[2J::error::x [/] <b>"
    assert terminal(name) == "\\x1b[2J::error::x [/] <b>"
    assert "worst: \\x1b[2J::error::x [/] <b>" in render_text(named(report, name))
    assert "worst: \\\\x1b\\[2J::error::x \\[/\\] \\<b>" in render_markdown(named(report, name))
    assert "%3A%3Aerror" not in "\n".join(gate_output.github_annotations(gate_result(report, name)))


# ------------------------------------------------------------------------------------------ the TUI

class _Names(App[None]):
    """A table and a panel showing the corpus as the views do (name_text cells, finding details)."""

    def __init__(self, report: Report) -> None:
        super().__init__()
        self.report = report

    def compose(self) -> ComposeResult:
        yield DataTable(id="t")
        yield Static(id="s")

    def on_mount(self) -> None:
        t = self.query_one(DataTable)
        t.add_columns("name", "kernel")
        for n in CORPUS:
            t.add_row(name_text(n), name_text(n, "bold"))
        r = named(self.report, "".join(CORPUS))
        self.query_one(Static).update(headline(r) + Text("\n") + detail(r["findings"][-1], r["mfu"]))


def test_tui_shows_hostile_names_as_text(report: Report) -> None:
    async def run() -> None:
        app = _Names(report)
        async with app.run_test(size=(120, 60)) as pilot:
            await pilot.pause()
            t = app.query_one(DataTable)
            shown = [t.get_row_at(i)[0] for i in range(t.row_count)]
            assert [c.plain for c in shown] == [terminal(n) for n in CORPUS]
            assert not any(span.style and "link" in str(span.style) for c in shown for span in c.spans)
            assert_terminal_safe("\n".join(c.plain for c in shown))
        assert app.return_code in (None, 0)

    asyncio.run(run())


# ------------------------------------------------------------------------------------ end to end

def _hostile_trace(tmp: Path) -> Path:
    """The kernel_inefficiency case with its worst kernel renamed to hold the corpus's first names."""
    src, dst = tmp / "src", tmp / "hostile"
    generate("kernel_inefficiency", src, world_size=2)
    dst.mkdir()
    hostile = "void at::native::vectorized_elementwise_kernel<4, " + CORPUS[0] + CORPUS[6] + "[/]<details>"
    for p in src.iterdir():
        text = p.read_text()
        if p.name.startswith("rank"):
            text = re.sub(r'"name": "void at::native::vectorized_elementwise_kernel<4, at::native::GeluBackward[^"]*"',
                          lambda m: '"name": ' + json.dumps(hostile), text)
        (dst / p.name).write_text(text)
    return dst


def test_cli_output_of_a_hostile_trace_is_inert(tmp_path: Path) -> None:
    trace = _hostile_trace(tmp_path)
    analyzed = run_diag("analyze", str(trace), "--format", "json", "--out", str(tmp_path / "cur.json"))
    assert analyzed.returncode == 0, analyzed.stderr
    assert "::error file=x" in (tmp_path / "cur.json").read_text()   # JSON keeps the name (escaped by JSON)
    summary = tmp_path / "summary.md"
    base = tmp_path / "base.json"
    base.write_text(json.dumps({**json.loads((tmp_path / "cur.json").read_text()), "findings": []}))
    for fmt in ("text", "markdown", "html"):
        g = run_diag("gate", "--baseline", str(base), str(tmp_path / "cur.json"), "--format", fmt,
                     "--junit", str(tmp_path / "j.xml"),
                     env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)})
        assert g.returncode == 1, g.stderr
        assert "pwned" in g.stdout
        assert_terminal_safe(g.stdout)
        commands = [line for line in g.stderr.splitlines() if line.lstrip().startswith("::")]
        assert commands and all(re.match(r"::(error|warning) title=diag gate%3A [^:]*::", c) for c in commands)
        ET.parse(tmp_path / "j.xml")
    assert_terminal_safe(summary.read_text())
    assert "<details>" not in summary.read_text()
    for fmt in ("text", "markdown", "html"):
        report = run_diag("analyze", str(trace), "--format", fmt)
        assert report.returncode == 0 and "pwned" in report.stdout, report.stderr
        assert_terminal_safe(report.stdout)
