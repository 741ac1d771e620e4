"""The command line as a contract (issue 12): what a newcomer types, what a pipe or a CI log gets,
the version, and the one line a bad value earns. Every case runs `diag` as a real subprocess."""

from __future__ import annotations

import argparse
import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, run_diag

from diag import __version__
from diag.cli import build_parser
from diag.runtime.durations import data_size, number, percent, signed_percent, significant, times

pytestmark = pytest.mark.xdist_group("cli")


def test_version_is_the_packages_and_the_reports(tmp_path: Path) -> None:
    done = run_diag("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"diag {__version__}"
    report = run_diag("demo", "--format", "json", "--out", str(tmp_path / "demo"), env={"TMPDIR": str(tmp_path)})
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["diag_version"] == __version__


def test_demo_without_a_terminal_prints_the_report_and_leaves_nothing(tmp_path: Path) -> None:
    """`diag demo </dev/null >out.txt`: no UI where nobody can see it; the report, exit 0, and the
    generated run removed (TMPDIR is this test's own, so what is left there is the demo's)."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    done = run_diag("demo", env={"TMPDIR": str(scratch)}, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "waterfall (MFU points" in done.stdout and "\x1b[" not in done.stdout
    assert "MFU005 stragglers" in done.stdout
    assert list(scratch.iterdir()) == []


def test_demo_out_keeps_the_run(tmp_path: Path) -> None:
    done = run_diag("demo", "--no-tui", "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    assert len(list((tmp_path / "run").glob("*.pt.trace.json*"))) == 8
    assert str(tmp_path / "run") in done.stderr


@pytest.mark.parametrize("command", ["tui", "live"])
def test_the_ui_without_a_terminal_is_one_line_and_exit_2(command: str, tmp_path: Path) -> None:
    done = run_diag(command, str(tmp_path))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "needs a terminal" in done.stderr, done.stderr


@pytest.mark.parametrize("command", [["example", "--out", "x"], ["capture", "--out", "x", "--", "python", "-c", "pass"]])
def test_a_command_needing_torch_says_which_extra(command: list[str], tmp_path: Path) -> None:
    """Without torch (hidden from the interpreter, as on a base install), exit 2 with the
    one line that says how to get it, before anything is started or written."""
    hide = tmp_path / "hide"
    hide.mkdir()
    # `sys.modules[name] = None` makes `import name` fail and find_spec answer None.
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None\n")
    done = run_diag(*command, cwd=tmp_path, env={"PYTHONPATH": f"{hide}:{ROOT}"})
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"diag {command[0]} needs torch: pip install -e '.[capture]'\n"
    assert not (tmp_path / "x").exists()


# --------------------------------------------------------------------------------- option values

@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo case's 8 ranks, without its model.toml: a trace that records no tokens per step."""
    from fixtures.generate import generate

    out = tmp_path_factory.mktemp("cli") / "run"
    generate("demo", out)
    (out / "model.toml").unlink()
    return out


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--peak-tflops", "0"), ("--peak-tflops", "-1"), ("--peak-tflops", "nan"), ("--peak-tflops", "inf"),
        ("--peak-tflops", "lots"), ("--tokens-per-step", "-4e6"), ("--tokens-per-step", "-inf"),
        ("--jobs", "0"), ("--jobs", "1.5"), ("--max-bytes", "0"), ("--max-bytes", "-5"), ("--rank", "-1"),
    ],
)
def test_a_bad_value_is_one_line_naming_option_and_value(option: str, value: str, tmp_path: Path) -> None:
    """Checked while parsing, before any work (the path does not even exist); a negative number is
    taken as the option's value, not as another option."""
    done = run_diag("analyze", str(tmp_path / "nowhere"), option, value)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"diag analyze: {option}: ")
    assert repr(value) in done.stderr


@pytest.mark.parametrize(("command", "option", "value"), [("live", "--poll", "0"), ("live", "--idle", "-1"),
                                                          ("mfu", "--gpus", "-8"), ("mfu", "--params", "-7e9")])
def test_other_commands_check_their_values_too(command: str, option: str, value: str, tmp_path: Path) -> None:
    done = run_diag(command, *([str(tmp_path)] if command == "live" else []), option, value)
    assert done.returncode == 2 and done.stderr == f"diag {command}: {option}: " + done.stderr.split(": ", 2)[2]
    assert repr(value) in done.stderr and done.stderr.count("\n") == 1


def test_a_preset_without_tokens_per_step_is_bad_input_with_the_hint(demo_run: Path) -> None:
    done = run_diag("analyze", str(demo_run), "--model", "llama3-70b")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("diag: --model: llama3-70b ")
    assert "--tokens-per-step N" in done.stderr
    with_tokens = run_diag("analyze", str(demo_run), "--model", "llama3-70b", "--tokens-per-step", "16",
                           "--format", "json")
    assert with_tokens.returncode == 0, with_tokens.stderr
    assert json.loads(with_tokens.stdout)["model"]["tokens_per_step"] == 16


@pytest.mark.parametrize("typed", ["h100", "H100", "h100-sxm", "NVIDIA H100 80GB HBM3"])
def test_gpu_takes_what_people_type(typed: str, demo_run: Path) -> None:
    done = run_diag("analyze", str(demo_run), "--gpu", typed, "--format", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["device"]["part"] == "h100-sxm"
    notes = [line for line in done.stderr.splitlines() if line.startswith("diag: note:")]
    assert (len(notes) == 1 and "H100 SXM" in notes[0] and "h100-pcie" in notes[0]) == (typed.lower() == "h100")


def test_an_unknown_gpu_lists_the_valid_names(tmp_path: Path) -> None:
    done = run_diag("analyze", str(tmp_path), "--gpu", "h1000")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "unknown GPU 'h1000'" in done.stderr and "h100-sxm" in done.stderr and "b200" in done.stderr


# -------------------------------------------------------------------------------------- messages

def test_an_empty_directory_names_itself_and_what_was_looked_for(tmp_path: Path) -> None:
    want = f"diag: {tmp_path}: no Kineto traces found (looked for *.json, *.json.gz, *.pt.trace.json[.gz])\n"
    for command in (["analyze", str(tmp_path)], ["ingest", str(tmp_path), "--db", str(tmp_path / "x.duckdb")]):
        done = run_diag(*command)
        assert (done.returncode, done.stderr) == (2, want), command
    # A store with nothing in it is named by its file, not by the connection object.
    store = run_diag("analyze", str(tmp_path / "x.duckdb"))
    assert (store.returncode, store.stderr) == (2, f"diag: {tmp_path / 'x.duckdb'}: no Kineto traces in the store: "
                                                   "ingest some first\n")


def test_odd_file_names_are_shown_escaped_on_one_line(demo_run: Path, tmp_path: Path) -> None:
    """A newline and a byte that is not UTF-8 in file names: each warning one line, escaped."""
    run = tmp_path / "run"
    run.mkdir()
    good = sorted(demo_run.glob("*.pt.trace.json*"))[0]
    (run / good.name).write_bytes(good.read_bytes())
    (run / "rank-1\n.json").write_text('{"traceEvents": [')
    os.mkdir(os.path.join(os.fsencode(run), b"odd\xff"))
    Path(os.fsdecode(os.path.join(os.fsencode(run), b"odd\xff", b"rank-2.json"))).write_text('{"traceEvents": [')
    for command in (["analyze", str(run)], ["ingest", str(run), "--db", str(tmp_path / "x.duckdb")]):
        done = run_diag(*command)
        assert done.returncode == 0, done.stderr
        left_out = [line for line in done.stderr.splitlines() if "truncated JSON" in line]
        assert len(left_out) == 2, done.stderr
        assert all(line.startswith("diag: warning: ") for line in left_out)
        assert any("rank-1\\n.json" in line for line in left_out)
        assert any("odd\\xff/rank-2.json" in line for line in left_out)


# -------------------------------------------------------------------------------------- progress

def _on_a_terminal(args: list[str]) -> tuple[int, str, str]:
    """`diag ARGS` with stderr on a pseudo-terminal (stdout a pipe): (exit code, stdout, the terminal's text)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "diag.cli", *args], cwd=ROOT, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=slave,
                            env=dict(os.environ, TERM="xterm-256color", COLUMNS="120"))
    os.close(slave)
    seen = bytearray()
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:     # EIO: the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    out = proc.stdout.read().decode() if proc.stdout else ""
    code = proc.wait(timeout=300)
    os.close(master)
    return code, out, seen.decode("utf-8", "replace")


def test_analyze_shows_progress_on_a_terminal_and_nothing_off_one(demo_run: Path) -> None:
    code, out, terminal = _on_a_terminal(["analyze", str(demo_run)])
    assert code == 0 and "waterfall" in out
    assert "ingest" in terminal and "8/8" in terminal and "ranks" in terminal and "\x1b[" in terminal
    quiet = run_diag("analyze", str(demo_run))
    assert quiet.returncode == 0 and quiet.stdout == out
    assert "\x1b[" not in quiet.stderr and "8/8" not in quiet.stderr


def _loaded_by(argv: list[str]) -> set[str]:
    """The modules `diag ARGV` has loaded when its parser exits (--help) or its work is done."""
    code = (f"import sys\nfrom diag.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
            "print(' '.join(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.strip().splitlines()[-1].split())


def test_help_imports_only_what_the_parser_needs() -> None:
    """`diag --help` (issue 16: ≤ 0.15 s) loads none of the heavy libraries, nor msgspec, whose import
    (typing_extensions) costs it ~20 ms, nor any command's modules (mfu's part table, capture, the
    commands' read-ahead: ~0.1 s together): the parser lists the commands without them."""
    loaded = _loaded_by(["--help"])
    tops = {m.split(".")[0] for m in loaded}
    assert not tops & {"duckdb", "pyarrow", "numpy", "polars", "pandas", "msgspec", "textual"}, tops
    assert not loaded & {"diag.commands", "diag.knowledge.mfu", "diag.knowledge.hardware", "diag.capture.profiler", "diag.capture.example",
                         "diag.ingest", "diag.tui_commands"}, sorted(m for m in loaded if m.startswith(("diag", "tui")))


def test_a_command_imports_its_own_modules_only() -> None:
    """`diag mfu --help` builds the mfu command's arguments (its module), not capture's or the
    trace commands'; every command's --help still lists its own options."""
    loaded = _loaded_by(["mfu", "--help"])
    assert "diag.knowledge.mfu" in loaded
    assert not loaded & {"diag.commands", "diag.capture.profiler", "diag.capture.example", "diag.ingest"}
    own = {"ingest": "--db", "analyze": "--model", "export": "--perfetto", "tui": "--theme", "live": "--poll",
           "gate": "--baseline", "mfu": "--tokens-per-s", "demo": "--no-tui", "capture": "--out", "example": "--nproc"}
    for command, option in own.items():
        done = run_diag(command, "--help")
        assert done.returncode == 0 and f"usage: diag {command}" in done.stdout and option in done.stdout, command


def test_every_command_and_option_says_what_it_does() -> None:
    """Issue 39: `diag --help` and each `diag COMMAND --help` describe every command and every
    option (ruff's and git's --help are the bar): a line for each command in the list, a paragraph
    with examples above each command's options, and a help line for each option and argument."""
    parser = build_parser(None)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    listed = {c.dest: c.help for c in sub._choices_actions}
    missing = []
    for name, p in sub.choices.items():
        if not listed.get(name):
            missing.append(f"{name}: no line in diag --help")
        if not p.description or "examples:\n  diag " not in p.description or f"  diag {name} " not in p.description:
            missing.append(f"{name}: no description with examples")
        missing += [f"{name} {a.option_strings or a.dest}: no help" for a in p._actions if not a.help]
    assert not missing, missing


def test_out_says_where_the_report_went(demo_run: Path, tmp_path: Path) -> None:
    """--out writes silently no more: one line on stderr, "wrote PATH (size)", the size in SI units
    of the bytes on disk; stdout stays empty (it is data)."""
    out = tmp_path / "report.json"
    done = run_diag("analyze", str(demo_run), "--format", "json", "--out", str(out))
    assert done.returncode == 0 and done.stdout == ""
    size = out.stat().st_size
    assert 1e3 <= size < 1e6                      # a demo report is tens of kB
    assert done.stderr.splitlines()[-1] == f"wrote {out} ({size / 1e3:.1f} kB)"


@pytest.mark.parametrize(("share", "says"), [(0.312, "31.2%"), (5.840865e-07, "0.000058%"), (-1e-5, "-0.0010%"),
                                             (-0.0, "0.0%"), (4.5e-30, "4.5×10⁻²⁸%"), (None, "unknown")])
def test_percent_is_for_people(share: float | None, says: str) -> None:
    assert percent(share) == says


def test_absurd_magnitudes_read_as_powers_of_ten() -> None:
    """Issue 39: "1e+30 TFLOP/s" and "738564813755653096342552576.0× the FLOPs" as people write them;
    numbers people type (989, 494.7 TFLOP/s) as before."""
    assert [number(x) for x in (989.0, 494.7, 1979.0, 0.0125, 1e30, 3.2e-9)] == \
        ["989", "494.7", "1979", "0.0125", "1×10³⁰", "3.2×10⁻⁹"]
    assert times(2.345) == "2.3×" and times(7.385648137556531e26) == "7.4×10²⁶×"
    assert [significant(x) for x in (0.498, 40.4, 6.07e-13)] == ["0.498", "40.4", "6.07×10⁻¹³"]
    assert significant(4.2e11, 4) == "4.2×10¹¹"
    assert [data_size(n) for n in (512, 12_345, 3_400_000)] == ["512 B", "12.3 kB", "3.4 MB"]


def test_signed_percent_never_reads_minus_zero() -> None:
    assert [signed_percent(x) for x in (0.007, -0.021, -0.0004, 0.0, -0.0)] == ["+0.7%", "−2.1%", "0.0%", "0.0%", "0.0%"]
