"""Capture Kineto traces that `diag analyze DIR` reads with no flags.

Two ways in, one set of profiler settings:

- `with capture(DIR, model=...) as cap:` around a training loop, calling `cap.step()` once per
  optimizer step;
- `diag capture --out DIR -- python train.py ...` for a script that does not know about diag: the
  child processes (torchrun's workers included) get a `sitecustomize` that profiles each
  `torch.optim` optimizer step, so one `ProfilerStep#N` is one optimizer step.

torch is the optional `capture` extra: this module imports it only inside the functions that
profile, so `diag.cli` can import it on a machine without torch.
"""

from __future__ import annotations

import argparse
import atexit
import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from diag.runtime.errors import BadInput, ExitCode, require

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

if TYPE_CHECKING:
    import torch.profiler

# The wrapper's contract with the processes it starts (read by install_step_hook).
ENV_DIR = "DIAG_CAPTURE_DIR"
ENV_SCHEDULE = "DIAG_CAPTURE_SCHEDULE"  # "wait,warmup,active,repeat"
MODEL_FILE = "model.toml"
# DESIGN.md's `[model]` form: enough for 6N + 12·L·H·Q·T per token and the tokens of a step.
MODEL_KEYS = ("params", "layers", "heads", "head_dim", "seq_len", "tokens_per_step")
# Flight Recorder names its dump `<prefix><rank>` (torch 2.13 FlightRecorder.hpp, DebugInfoWriter);
# diag's discovery takes extension-less `*trace_rank_N` files as Flight Recorder dumps.
FLIGHT_RECORDER_PREFIX = "nccl_trace_rank_"
# Where a watchdog timeout dumps it: torch 2.13 reads TORCH_FR_DUMP_TEMP_FILE, then
# TORCH_NCCL_DEBUG_INFO_TEMP_FILE, the name earlier releases read; both are set, to the same prefix.
_DUMP_FILE_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
# The ring buffer has been on by default (2000 entries) since pytorch#142260 (Dec 2024, torch 2.6)
# and was off before. torch 2.13 warns in every process that TORCH_NCCL_TRACE_BUFFER_SIZE is
# deprecated, so it is set only below 2.7, where it was the one name.
_BUFFER_ON_BY_DEFAULT_FROM = (2, 7)
_BUFFER_SIZE = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}


@dataclass(frozen=True)
class Schedule:
    """torch.profiler.schedule's four numbers: skip, warm up, record, and how many such cycles."""

    wait_steps: int = 1
    warmup_steps: int = 1
    active_steps: int = 3
    repeat_cycles: int = 1

    def __post_init__(self) -> None:
        if min(self.wait_steps, self.warmup_steps, self.repeat_cycles) < 0 or self.active_steps < 1:
            raise ValueError(f"bad profiler schedule {self}: active ≥ 1, the others ≥ 0")

    def to_env(self) -> str:
        return f"{self.wait_steps},{self.warmup_steps},{self.active_steps},{self.repeat_cycles}"

    @classmethod
    def from_env(cls, text: str) -> Schedule:
        wait, warmup, active, repeat = (int(part) for part in text.split(","))
        return cls(wait, warmup, active, repeat)


class Capture:
    """What `capture()` yields: call `step()` once at the end of every optimizer step."""

    def __init__(self, profiler: torch.profiler.profile, out_dir: Path) -> None:
        self._profiler = profiler
        self.out_dir = out_dir

    def step(self) -> None:
        with warnings.catch_warnings():
            # One file per cycle is what diag wants; torch warns that cycles do not accumulate.
            warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")
            self._profiler.step()


# Set once the script calls `capture()` itself: from then on the optimizer-step hook of
# `diag capture` stands aside for good (two Kineto profilers cannot run at once, and the
# script's own choice of steps wins).
_script_captures = False
_auto_session: _AutoSession | None = None


@contextmanager
def capture(
    out_dir: str | os.PathLike[str],
    *,
    wait: int = 1,
    warmup: int = 1,
    active: int = 3,
    repeat: int = 1,
    model: Mapping[str, float] | None = None,
) -> Iterator[Capture]:
    """Profile the enclosed steps into out_dir, one `{worker}.{time_ns}.pt.trace.json` per cycle.

    Initialize torch.distributed before the first recorded step: the profiler writes the trace's
    `distributedInfo` (rank, world size, process groups) only when it is initialized then.
    `model` is DESIGN.md's `[model]` description, written to out_dir/model.toml.
    """
    global _script_captures
    _script_captures = True
    if _auto_session is not None:
        _auto_session.close()
    with _profiled(Path(out_dir), Schedule(wait, warmup, active, repeat), model) as cap:
        yield cap


@contextmanager
def _profiled(out_dir: Path, schedule: Schedule, model: Mapping[str, float] | None) -> Iterator[Capture]:
    import torch
    from torch.profiler import ProfilerActivity

    out_dir.mkdir(parents=True, exist_ok=True)
    if model is not None:
        write_model_toml(out_dir, model)
    # Read when a process group is created, so this takes effect only for groups made later;
    # `diag capture` sets the same variables before the script starts.
    for name, value in flight_recorder_env(out_dir, os.environ).items():
        os.environ[name] = value
    # `{hostname}_{pid}.{time_ns}.pt.trace.json` (torch/profiler/profiler.py); the rank is in
    # the trace's distributedInfo, not in the name.
    write_trace = torch.profiler.tensorboard_trace_handler(str(out_dir))

    def on_trace_ready(profiler: torch.profiler.profile) -> None:
        write_trace(profiler)
        _dump_flight_recorder(out_dir)

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(
        activities=activities,
        # Input Dims give the FLOPs of each GEMM and the size of each collective.
        record_shapes=True,
        # Python stacks multiply the trace size and the overhead; diag does not read them.
        with_stack=False,
        schedule=torch.profiler.schedule(
            wait=schedule.wait_steps,
            warmup=schedule.warmup_steps,
            active=schedule.active_steps,
            repeat=schedule.repeat_cycles,
        ),
        on_trace_ready=on_trace_ready,
    )
    with profiler:
        yield Capture(profiler, out_dir)


def flight_recorder_env(out_dir: Path, current: Mapping[str, str]) -> dict[str, str]:
    """The variables that switch Flight Recorder on and dump it into out_dir on a watchdog timeout.

    A variable the user set already is left alone, and so is the dump path when either of its
    two names is set. They take effect only in a process that has not created its process groups.
    """
    wanted = {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    if _torch_version() < _BUFFER_ON_BY_DEFAULT_FROM:
        wanted.update(_BUFFER_SIZE)
    if not any(name in current for name in _DUMP_FILE_VARS):
        wanted.update(dict.fromkeys(_DUMP_FILE_VARS, str(out_dir.resolve() / FLIGHT_RECORDER_PREFIX)))
    return {name: value for name, value in wanted.items() if name not in current}


def _torch_version() -> tuple[int, int]:
    """(major, minor) of the installed torch, without importing it; (0, 0) when it is absent."""
    import importlib.metadata  # here, not at the top: it costs `diag --help` ~15 ms (issue 16)

    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return (0, 0)
    major, minor = (int(part) for part in re.findall(r"\d+", version)[:2])
    return (major, minor)


def _dump_flight_recorder(out_dir: Path) -> None:
    """Write this rank's Flight Recorder buffer beside its traces, as a timeout would write it.

    torch's dump is a pickle of the last collectives with their process group and sequence
    numbers (gloo's too, in torch 2.13); it is rewritten after every cycle, so it covers the traces.
    """
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    c10d = torch._C._distributed_c10d
    # NCCL keeps its own recorder (CUDA events); other backends share the generic one.
    dump = getattr(c10d, "_dump_nccl_trace" if "nccl" in dist.get_backend() else "_dump_fr_trace", None)
    if dump is None:  # a torch older than the generic Flight Recorder
        return
    try:
        data = dump()
    except RuntimeError as error:
        print(f"diag capture: no Flight Recorder dump ({error})", file=sys.stderr)
        return
    path = out_dir / f"{FLIGHT_RECORDER_PREFIX}{dist.get_rank()}"
    tmp = out_dir / f".{path.name}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, path)


def model_toml(model: Mapping[str, float]) -> str:
    """DESIGN.md's `[model]` table; every key required, every value a positive number."""
    unknown = sorted(set(model) - set(MODEL_KEYS))
    missing = [key for key in MODEL_KEYS if key not in model]
    if unknown or missing:
        raise ValueError(f"model description: missing {missing}, unknown {unknown}; needs {list(MODEL_KEYS)}")
    lines = ["[model]"]
    for key in MODEL_KEYS:
        value = model[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ValueError(f"model description: {key} = {value!r} is not a positive number")
        lines.append(f"{key} = {int(value) if float(value).is_integer() else float(value)!r}")
    return "\n".join(lines) + "\n"


def write_model_toml(out_dir: Path, model: Mapping[str, float]) -> Path:
    """Write out_dir/model.toml atomically, so that ranks writing the same text at once are harmless."""
    path = out_dir / MODEL_FILE
    # A leading dot keeps diag's discovery off the half-written file.
    tmp = out_dir / f".{MODEL_FILE}.{os.getpid()}.tmp"
    tmp.write_text(model_toml(model))
    os.replace(tmp, path)
    return path


def read_model_toml(path: Path) -> dict[str, float]:
    """The `[model]` table of a model file, checked as model_toml checks it."""
    try:
        table = tomllib.loads(path.read_text()).get("model")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise BadInput(str(path), f"cannot read the model description: {error}") from error
    if not isinstance(table, dict):
        raise BadInput(str(path), "no [model] table (see DESIGN.md: params, layers, heads, ...)")
    try:
        model_toml(table)
    except ValueError as error:
        raise BadInput(str(path), str(error)) from error
    return table


# ---------------------------------------------------------------- the optimizer-step hook


class _AutoSession:
    """A capture started by the first optimizer step of a process run under `diag capture`."""

    def __init__(self, out_dir: Path, schedule: Schedule) -> None:
        self._stack = ExitStack()
        self._capture = self._stack.enter_context(_profiled(out_dir, schedule, model=None))
        # Flush a cycle the run ended in the middle of (torch writes it on stop).
        atexit.register(self.close)

    def step(self) -> None:
        self._capture.step()

    def close(self) -> None:
        global _auto_session
        _auto_session = None
        self._stack.close()


_optimizer_step_depth = 0


def _on_optimizer_step() -> None:
    """Each optimizer step ends one ProfilerStep; the first starts the capture."""
    global _auto_session
    if _script_captures:
        return
    if _auto_session is None:
        # Start at the end of the first step, so that ProfilerStep#0 is a whole iteration
        # (data, forward, backward, optimizer) like every later one.
        _auto_session = _AutoSession(Path(os.environ[ENV_DIR]), Schedule.from_env(os.environ[ENV_SCHEDULE]))
    else:
        _auto_session.step()


def _hook_optimizer_steps(optimizer_module: ModuleType) -> None:
    """Make every optimizer class's step end a ProfilerStep once its own profiler span has closed.

    torch.optim's global post-step hook runs inside the `Optimizer.step#...` span, and ending the
    ProfilerStep there leaves that span straddling two steps. Optimizer.__init__ wraps each class's
    `step` with the static `profile_hook_step` (torch 2.1-2.13), so wrapping that wrapper puts the
    boundary just outside the span, for classes and LR schedulers set up after this runs.
    """
    import functools

    optimizer_class = optimizer_module.Optimizer
    profile_hook_step = optimizer_class.profile_hook_step

    def hook_step(func: Callable[..., Any]) -> Callable[..., Any]:
        profiled = profile_hook_step(func)

        @functools.wraps(profiled)
        def step(*args: Any, **kwargs: Any) -> Any:
            global _optimizer_step_depth
            # An optimizer stepping an inner one (ZeroRedundancyOptimizer) is one step, not two.
            _optimizer_step_depth += 1
            try:
                out = profiled(*args, **kwargs)
            finally:
                _optimizer_step_depth -= 1
            if _optimizer_step_depth == 0:
                _on_optimizer_step()
            return out

        return step

    optimizer_class.profile_hook_step = staticmethod(hook_step)


class _AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Run a callback right after a module's body executes, without importing it ourselves.

    So that processes that never import torch (launchers, tools) do not pay for it.
    """

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self._name = name
        self._then = then
        self._inner: importlib.abc.Loader | None = None

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self._name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        self._inner = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        assert self._inner is not None
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        assert self._inner is not None
        # Give the module its real loader back (inspect and linecache ask it for source).
        module.__loader__ = self._inner
        if module.__spec__ is not None:
            module.__spec__.loader = self._inner
        self._inner.exec_module(module)
        self._then(module)


def install_step_hook() -> None:
    """Called by the `sitecustomize` of `diag capture`: profile optimizer steps into $DIAG_CAPTURE_DIR."""
    if ENV_DIR not in os.environ:
        return
    name = "torch.optim.optimizer"
    if name in sys.modules:
        _hook_optimizer_steps(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, _hook_optimizer_steps))


def run_shadowed_sitecustomize(own_file: str) -> None:
    """Run the `sitecustomize` that ours hides (PYTHONPATH comes first), as Python would have."""
    own_dir = Path(own_file).resolve().parent
    rest = [entry for entry in sys.path if Path(entry or ".").resolve() != own_dir]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_SITECUSTOMIZE = """\
# Written by `diag capture` for the run it wraps, and removed when the run ends.
import sys

try:
    import diag.capture.profiler
except ImportError as error:
    sys.stderr.write(f"diag capture: this Python cannot import diag ({error}); it writes no trace\\n")
else:
    diag.capture.profiler.install_step_hook()
    diag.capture.profiler.run_shadowed_sitecustomize(__file__)
"""


# ---------------------------------------------------------------- the wrapper and its CLI


def run_capture(
    argv: list[str],
    out_dir: str | os.PathLike[str],
    *,
    wait: int = 1,
    warmup: int = 1,
    active: int = 3,
    repeat: int = 1,
    model: Mapping[str, float] | None = None,
) -> int:
    """Run argv with every Python process under it profiling its optimizer steps into out_dir.

    Returns the command's exit status (128 + N when signal N ended it, as a shell reports it).
    """
    if not argv:
        raise ValueError("no command to run: diag capture --out DIR -- python train.py ...")
    schedule = Schedule(wait, warmup, active, repeat)
    out = prepare_out_dir(out_dir)
    if model is not None:
        write_model_toml(out, model)
    import subprocess
    import tempfile

    env = dict(os.environ)
    env.update(flight_recorder_env(out, env))
    env[ENV_DIR] = str(out)
    env[ENV_SCHEDULE] = schedule.to_env()
    with tempfile.TemporaryDirectory(prefix="diag-capture-") as site:
        Path(site, "sitecustomize.py").write_text(_SITECUSTOMIZE)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [site, env.get("PYTHONPATH")]))
        status = subprocess.run(argv, env=env).returncode
    return 128 - status if status < 0 else status


def prepare_out_dir(out_dir: str | os.PathLike[str]) -> Path:
    """Create the directory a new run's traces go to; refuse one holding another run's traces.

    Two runs' files in one directory would give diag two traces of every rank.
    """
    out = Path(out_dir).resolve()
    if any(out.glob("*.pt.trace.json*")):
        raise ValueError(f"{out} already holds traces of another run: give an empty or new directory")
    out.mkdir(parents=True, exist_ok=True)
    return out


def add_capture_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, type=Path, help="directory for the traces and model.toml")
    parser.add_argument("--wait", type=int, default=1, help="optimizer steps skipped before each cycle")
    parser.add_argument("--warmup", type=int, default=1, help="steps profiled but not recorded")
    parser.add_argument("--active", type=int, default=3, help="steps recorded per cycle (one file per rank)")
    parser.add_argument("--repeat", type=int, default=1, help="cycles (0: until the run ends)")
    parser.add_argument("--model", type=Path, help="a model.toml ([model] params, layers, ...) to put beside the traces")
    # Not `command`: diag's own parser keeps the subcommand's name there.
    parser.add_argument(
        "argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ...", help="python train.py ... (or torchrun ...)"
    )


def run_capture_command(args: argparse.Namespace) -> int:
    require("torch", "capture", "capture")
    command = list(args.argv)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print("diag capture: no command given: diag capture --out DIR -- python train.py ...", file=sys.stderr)
        return ExitCode.BAD_INPUT
    model = read_model_toml(args.model) if args.model is not None else None
    try:
        return run_capture(
            command, args.out, wait=args.wait, warmup=args.warmup, active=args.active, repeat=args.repeat, model=model
        )
    except (ValueError, OSError) as error:  # OSError: the command cannot be started
        print(f"diag capture: {error}", file=sys.stderr)
        return ExitCode.BAD_INPUT
