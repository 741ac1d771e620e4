"""diag.knowledge.model and diag.knowledge.mfu: FLOPs per token, model files, and `diag mfu` in all three directions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import run_diag

from diag.cli import main
from diag.knowledge.mfu import MfuResult, solve_mfu
from diag.knowledge.model import PRESETS, ModelSpec, executed_flops_per_token, flops_per_token, load_model
from diag.runtime.errors import BadInput

# --- model -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("preset", "params", "layers", "heads"),
    [
        # Non-embedding parameters from the Llama 3 architecture (see diag/knowledge/model.py).
        ("llama3-8b", 6_979_588_096, 32, 32),  # ~6.98e9
        ("llama3-70b", 68_452_360_192, 80, 64),  # ~68.5e9
        ("llama3-405b", 401_650_696_192, 126, 128),  # ~404e9 with the output projection
    ],
)
def test_llama3_presets(preset: str, params: int, layers: int, heads: int) -> None:
    spec = load_model(preset)
    assert (spec.params, spec.layers, spec.heads, spec.head_dim, spec.seq_len) == (
        params,
        layers,
        heads,
        128,
        8192,
    )
    assert spec.name == preset


def test_flops_per_token_is_6n_plus_12lhqt() -> None:
    spec = PRESETS["llama3-70b"]
    attention = 12 * 80 * 64 * 128 * 8192
    assert flops_per_token(spec) == 6 * spec.params + attention
    assert flops_per_token(ModelSpec(70e9, 0, 0, 0, 0, None, "6N only")) == 6 * 70e9


def test_recomputation_executes_more_than_the_model_needs() -> None:
    spec = ModelSpec(
        params=1e9, layers=16, heads=16, head_dim=128, seq_len=4096, tokens_per_step=None, name="m"
    )
    lhqt = 16 * 16 * 128 * 4096
    assert executed_flops_per_token(spec, "none") == 6e9 + 12 * lhqt
    assert executed_flops_per_token(spec, "selective") == 6e9 + 16 * lhqt  # attention core again
    assert executed_flops_per_token(spec, "full") == 8e9 + 16 * lhqt  # the whole forward again
    with pytest.raises(ValueError, match="recompute"):
        executed_flops_per_token(spec, "some")  # type: ignore[arg-type]


def test_model_spec_rejects_impossible_values() -> None:
    with pytest.raises(ValueError, match="params"):
        ModelSpec(0, 1, 1, 1, 1, None, "m")
    with pytest.raises(ValueError, match="layers"):
        ModelSpec(1e9, -1, 1, 1, 1, None, "m")
    with pytest.raises(ValueError, match="tokens_per_step"):
        ModelSpec(1e9, 1, 1, 1, 1, 0, "m")


MODEL_TOML = """\
[model]
params = 1.2e9            # N, non-embedding
layers = 16
heads = 16
head_dim = 128
seq_len = 4096
tokens_per_step = 524288  # global tokens per optimizer step
"""


def test_load_model_file(tmp_path: Path) -> None:
    path = tmp_path / "my-1b.toml"
    path.write_text(MODEL_TOML)
    assert load_model(str(path)) == ModelSpec(1.2e9, 16, 16, 128, 4096, 524288.0, "my-1b")
    path.write_text(MODEL_TOML.replace("tokens_per_step = 524288", 'name = "one-b"'))
    spec = load_model(str(path))
    assert (spec.tokens_per_step, spec.name) == (None, "one-b")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (MODEL_TOML.replace("layers = 16\n", ""), "missing 'layers'"),
        (MODEL_TOML.replace("params = 1.2e9", "params = -1"), "params must be a positive number"),
        (MODEL_TOML.replace("heads = 16", "heads = 16.5"), "heads must be a whole number"),
        (MODEL_TOML.replace("heads = 16", 'heads = "16"'), "heads must be a positive number"),
        (MODEL_TOML.replace("seq_len", "seq_length"), "unknown key"),
        (MODEL_TOML.replace("[model]", "[modle]"), "no [model] table"),
        (MODEL_TOML.replace("layers = 16", "layers = "), "cannot read the model file"),
    ],
)
def test_malformed_model_file_is_bad_input(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "model.toml"
    path.write_text(text)
    with pytest.raises(BadInput, match=message.replace("[", r"\[")) as error:
        load_model(str(path))
    assert error.value.path == str(path)
    assert "\n" not in error.value.one_line()


def test_unknown_model_is_bad_input() -> None:
    with pytest.raises(BadInput, match="llama3-8b"):
        load_model("llama3-7b")


# --- mfu -------------------------------------------------------------------------------------


def test_seed_examples() -> None:
    # 70B on 1,024 H100 at 12,000 tokens/s is about 0.5% MFU.
    slow = solve_mfu(peak_tflops=989, flops_per_token=6 * 70e9, gpus=1024, tokens_per_s=12_000)
    assert round(100 * slow.mfu, 3) == 0.498
    # At 40% MFU those GPUs give about 965,000 tokens/s.
    fast = solve_mfu(peak_tflops=989, flops_per_token=6 * 70e9, gpus=1024, mfu=0.40)
    assert 964_500 <= fast.tokens_per_s <= 964_600  # type: ignore[operator]
    # 400 TFLOP/s per GPU on H100 is 40.4%.
    per_gpu = solve_mfu(peak_tflops=989, flops_per_token=None, gpus=None, tflops_per_gpu=400)
    assert round(100 * per_gpu.mfu, 1) == 40.4
    assert per_gpu.tokens_per_s is None


def test_solve_mfu_round_trips() -> None:
    there = solve_mfu(peak_tflops=312, flops_per_token=5e10, gpus=64, tokens_per_s=150_000)
    back = solve_mfu(peak_tflops=312, flops_per_token=5e10, gpus=64, mfu=there.mfu)
    assert back.tokens_per_s == pytest.approx(150_000)
    via_tflops = solve_mfu(
        peak_tflops=312, flops_per_token=5e10, gpus=64, tflops_per_gpu=there.model_tflops_per_gpu
    )
    assert via_tflops.tokens_per_s == pytest.approx(150_000)


def test_solve_mfu_needs_exactly_one_known() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        solve_mfu(peak_tflops=989, flops_per_token=1e9, gpus=8)
    with pytest.raises(ValueError, match="exactly one"):
        solve_mfu(peak_tflops=989, flops_per_token=1e9, gpus=8, mfu=0.4, tokens_per_s=1.0)
    with pytest.raises(ValueError, match="flops_per_token and gpus"):
        solve_mfu(peak_tflops=989, flops_per_token=None, gpus=8, mfu=0.4)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    assert main(["mfu", *argv]) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


BASE = ["--params", "70e9", "--gpus", "1024", "--gpu", "h100-sxm"]


def test_json_is_exactly_the_contract(capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = _run([*BASE, "--tokens-per-s", "12000", "--format", "json"], capsys)
    report = json.loads(out)
    assert list(report) == ["mfu", "tokens_per_s", "peak_tflops", "flops_per_token"]
    assert (
        report["peak_tflops"] == 989
        and report["flops_per_token"] == 420e9
        and report["tokens_per_s"] == 12000
    )
    assert round(100 * report["mfu"], 3) == 0.498
    out, _ = _run([*BASE, "--mfu", "0.40", "--format", "json"], capsys)
    assert 964_500 <= json.loads(out)["tokens_per_s"] <= 964_600
    out, _ = _run(["--tflops-per-gpu", "400", "--gpu", "h100-sxm", "--format", "json"], capsys)
    assert json.loads(out)["tokens_per_s"] is None and json.loads(out)["flops_per_token"] is None


def test_text_output(capsys: pytest.CaptureFixture[str]) -> None:
    out, err = _run([*BASE, "--tokens-per-s", "12000"], capsys)
    assert "MFU            0.498%" in out and "H100 SXM bf16 dense" in out and err == ""
    out, _ = _run(["--tflops-per-gpu", "400", "--gpu", "h100-sxm"], capsys)
    assert "MFU            40.4%" in out


def test_attention_term_and_model_presets(capsys: pytest.CaptureFixture[str]) -> None:
    attention = ["--layers", "80", "--heads", "64", "--head-dim", "128", "--seq-len", "8192"]
    out, _ = _run([*BASE, *attention, "--tokens-per-s", "12000", "--format", "json"], capsys)
    assert json.loads(out)["flops_per_token"] == 6 * 70e9 + 12 * 80 * 64 * 128 * 8192
    out, _ = _run(
        ["--model", "llama3-70b", "--gpus", "1024", "--gpu", "h100-sxm", "--mfu", "0.4", "--format", "json"],
        capsys,
    )
    assert json.loads(out)["flops_per_token"] == flops_per_token(PRESETS["llama3-70b"])


def test_peak_override_and_sparse_warning(capsys: pytest.CaptureFixture[str]) -> None:
    out, err = _run(
        [
            "--params",
            "70e9",
            "--gpus",
            "1024",
            "--peak-tflops",
            "1979",
            "--tokens-per-s",
            "12000",
            "--format",
            "json",
        ],
        capsys,
    )
    assert json.loads(out)["peak_tflops"] == 1979
    assert "with sparsity" in err and "989" in err and "MFU007" in err
    out, err = _run(["--params", "70e9", "--gpus", "8", "--peak-tflops", "900", "--mfu", "0.5"], capsys)
    assert err == ""
    out, err = _run([*BASE, "--dtype", "fp8", "--mfu", "0.5", "--format", "json"], capsys)
    assert json.loads(out)["peak_tflops"] == 1979  # fp8 dense: not a sparse figure, no warning
    assert err == ""


def test_v100_defaults_to_its_fp16_peak(capsys: pytest.CaptureFixture[str]) -> None:
    # V100 has no bf16: the default dtype is fp16, tensor-core dense 125 TFLOP/s (V100 SXM2 datasheet).
    out, _ = _run(["--tflops-per-gpu", "50", "--gpu", "v100", "--format", "json"], capsys)
    assert json.loads(out)["peak_tflops"] == 125.0 and json.loads(out)["mfu"] == pytest.approx(0.4)


def test_a_dtype_mix_gives_the_effective_peak(capsys: pytest.CaptureFixture[str]) -> None:
    # fp8 twice the bf16 FLOPs on H100 SXM: 1 / (2/3 / 1979 + 1/3 / 989) = 1483.87 TFLOP/s.
    out, _ = _run([*BASE, "--dtype", "fp8=2,bf16=1", "--tflops-per-gpu", "700", "--format", "json"], capsys)
    peak = 1 / ((2 / 3) / 1979 + (1 / 3) / 989)
    assert json.loads(out)["peak_tflops"] == pytest.approx(peak)
    assert json.loads(out)["mfu"] == pytest.approx(700 / peak)


@pytest.mark.parametrize(
    ("argv", "where"),
    [
        ([*BASE], "diag mfu"),  # nothing to solve from
        ([*BASE, "--mfu", "0.4", "--tokens-per-s", "1"], "diag mfu"),
        (["--gpus", "8", "--gpu", "h100-sxm", "--mfu", "0.4"], "--mfu"),  # no FLOPs per token
        (["--params", "7e9", "--gpu", "h100-sxm", "--mfu", "0.4"], "--mfu"),  # no --gpus
        (["--params", "7e9", "--gpus", "8", "--mfu", "0.4"], "--gpu"),  # no peak
        (["--params", "7e9", "--gpus", "8", "--gpu", "h1000", "--mfu", "0.4"], "--gpu"),
        (["--params", "7e9", "--gpus", "8", "--gpu", "v100", "--dtype", "bf16", "--mfu", "0.4"], "--dtype"),  # no bf16
        ([*BASE, "--dtype", "fp8=lots", "--mfu", "0.4"], "--dtype"),
        (["--params", "7e9", "--gpus", "8.5", "--gpu", "h100-sxm", "--mfu", "0.4"], "--gpus"),
        (["--params", "seven", "--gpus", "8", "--gpu", "h100-sxm", "--mfu", "0.4"], "--params"),
        (["--params", "7e9", "--gpus", "8", "--gpu", "h100-sxm", "--mfu", "40"], "--mfu"),  # a percentage
        (["--params", "7e9", "--gpus", "8", "--gpu", "h100-sxm", "--mfu", "-0.1"], "--mfu"),
        (["--params", "-7e9", "--gpus", "8", "--gpu", "h100-sxm", "--mfu", "0.1"], "--params"),  # a value, not an option
        (["--params", "7e9", "--gpus", "-inf", "--gpu", "h100-sxm", "--mfu", "0.1"], "--gpus"),
        (["--params", "7e9", "--gpus", "8", "--peak-tflops", "nan", "--mfu", "0.1"], "--peak-tflops"),
        ([*BASE, "--tokens-per-s", "1.2e9"], "--tokens-per-s"),  # 49,800 % MFU: the inputs contradict
        ([*BASE, "--tflops-per-gpu", "1200"], "--tflops-per-gpu"),  # above the 989 peak
        ([*BASE, "--layers", "80", "--mfu", "0.4"], "--layers"),  # one of four attention flags
        ([*BASE, "--model", "llama3-8b", "--mfu", "0.4"], "--model"),
    ],
)
def test_bad_input_names_the_flag(argv: list[str], where: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 2 and one line on stderr naming the flag, whether argparse or run_mfu found it."""
    with pytest.raises(SystemExit) as parsed:
        code = main(["mfu", *argv])
        raise SystemExit(code)
    out, err = capsys.readouterr()
    assert parsed.value.code == 2 and out == ""
    assert err.count("\n") == 1 and f" {where}: " in f" {err.removeprefix('diag: ')}", err


def test_subprocess_contract() -> None:
    """`diag mfu` as a process: JSON on stdout, exit 0; bad input is one stderr line and exit 2."""
    ok = run_diag("mfu", *BASE, "--mfu", "0.40", "--format", "json")
    assert ok.returncode == 0, ok.stderr
    assert set(json.loads(ok.stdout)) == {"mfu", "tokens_per_s", "peak_tflops", "flops_per_token"}
    bad = run_diag("mfu", *BASE, "--tokens-per-s", "lots")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == "diag mfu: --tokens-per-s: not a number: 'lots'\n"


def test_result_carries_units() -> None:
    result = solve_mfu(peak_tflops=989, flops_per_token=420e9, gpus=1024, tokens_per_s=12_000)
    assert isinstance(result, MfuResult)
    assert result.model_tflops_per_gpu == pytest.approx(12_000 * 420e9 / 1024 / 1e12)
    assert result.gpus == 1024
