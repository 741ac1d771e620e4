"""The model being trained, and its FLOPs per token.

Model FLOPs per token (PaLM, Chowdhery et al. 2022, App. B; DESIGN.md):

    6N + 12*L*H*Q*T

N non-embedding parameters (each does a multiply-add forward and two backward: 6 FLOPs per
token), and attention's QK^T and PV over a sequence of T (L layers, H heads of dimension Q),
which no parameter accounts for: 2 GEMMs x 2 FLOPs x T x H*Q per layer forward, x3 with backward.

Recomputation executes more than the model needs (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models"): full recomputation runs each layer's forward again,
8N + 16*L*H*Q*T; selective recomputation redoes only the attention core (QK^T, softmax, PV),
6N + 16*L*H*Q*T. That excess is the gap between HFU and MFU.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from diag.runtime.errors import BadInput, in_words

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - pyproject's `tomli; python_version < '3.11'`
    import tomli as tomllib

Recompute = Literal["none", "selective", "full"]


@dataclass(frozen=True)
class ModelSpec:
    params: float  # N, non-embedding parameters
    layers: int  # L; layers = heads = head_dim = seq_len = 0 leaves out the attention term
    heads: int  # H, query heads
    head_dim: int  # Q
    seq_len: int  # T, tokens per sequence
    tokens_per_step: float | None  # global tokens per optimizer step, where known
    name: str

    def __post_init__(self) -> None:
        if not self.params > 0:
            raise ValueError(f"params must be positive, got {self.params!r}")
        for key in ("layers", "heads", "head_dim", "seq_len"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must not be negative, got {getattr(self, key)!r}")
        if self.tokens_per_step is not None and not self.tokens_per_step > 0:
            raise ValueError(f"tokens_per_step must be positive, got {self.tokens_per_step!r}")


def _llama3_non_embedding_params(layers: int, hidden: int, ffn: int, kv_heads: int, head_dim: int) -> int:
    """Per layer: Wq and Wo (hidden x hidden each), Wk and Wv (hidden x kv_heads*head_dim each),
    the SwiGLU MLP's three hidden x ffn matrices, two RMSNorm weights; plus the final norm.
    The token embedding and the output projection (vocab x hidden, untied) are left out."""
    attention = 2 * hidden * hidden + 2 * hidden * kv_heads * head_dim
    mlp = 3 * hidden * ffn
    return layers * (attention + mlp + 2 * hidden) + hidden


# Llama 3 (Grattafiori et al. 2024, "The Llama 3 Herd of Models", Table 3): layers, model dim,
# FFN dim, 8 KV heads, head dim 128, vocabulary 128K; trained at sequence length 8,192.
#   8B:   32 x (2*4096^2 + 2*4096*1024 + 3*4096*14336 + 2*4096) + 4096          =   6,979,588,096
#   70B:  80 x (2*8192^2 + 2*8192*1024 + 3*8192*28672 + 2*8192) + 8192          =  68,452,360,192
#   405B: 126 x (2*16384^2 + 2*16384*1024 + 3*16384*53248 + 2*16384) + 16384    = 401,650,696,192
# (405B's often-quoted ~404e9 adds the 2.1e9-parameter output projection; total with both
# embedding matrices is 405.9e9.)
PRESETS: dict[str, ModelSpec] = {
    "llama3-8b": ModelSpec(
        params=_llama3_non_embedding_params(32, 4096, 14336, 8, 128),
        layers=32,
        heads=32,
        head_dim=128,
        seq_len=8192,
        tokens_per_step=None,
        name="llama3-8b",
    ),
    "llama3-70b": ModelSpec(
        params=_llama3_non_embedding_params(80, 8192, 28672, 8, 128),
        layers=80,
        heads=64,
        head_dim=128,
        seq_len=8192,
        tokens_per_step=None,
        name="llama3-70b",
    ),
    "llama3-405b": ModelSpec(
        params=_llama3_non_embedding_params(126, 16384, 53248, 8, 128),
        layers=126,
        heads=128,
        head_dim=128,
        seq_len=8192,
        tokens_per_step=None,
        name="llama3-405b",
    ),
}

_INT_KEYS = ("layers", "heads", "head_dim", "seq_len")
_KNOWN_KEYS = frozenset({"params", *_INT_KEYS, "tokens_per_step", "name"})


def load_model(arg: str) -> ModelSpec:
    """A preset name (llama3-8b, llama3-70b, llama3-405b) or the path of a TOML model file:

    [model]
    params = 1.2e9            # N, non-embedding
    layers = 16
    heads = 16
    head_dim = 128
    seq_len = 4096
    tokens_per_step = 524288  # optional: global tokens per optimizer step
    name = "my-1b"            # optional: defaults to the file's stem
    """
    if arg in PRESETS:
        return PRESETS[arg]
    path = Path(arg)
    if not path.is_file():
        raise BadInput(arg, f"not a model preset ({', '.join(PRESETS)}) and not a file")
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:   # also TOML's errors and an integer past Python's digits limit
        raise BadInput(arg, f"cannot read the model file: {in_words(error)}") from error
    table = document.get("model")
    if not isinstance(table, dict):
        raise BadInput(arg, "no [model] table (see DESIGN.md: params, layers, heads, head_dim, seq_len)")
    return _spec_from_table(arg, table, default_name=path.stem)


def _spec_from_table(where: str, table: dict[str, Any], default_name: str) -> ModelSpec:
    unknown = sorted(set(table) - _KNOWN_KEYS)
    if unknown:
        raise BadInput(
            where, f"[model] has unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(_KNOWN_KEYS))}"
        )
    for key in ("params", *_INT_KEYS):
        if key not in table:
            raise BadInput(
                where, f"[model] is missing {key!r} (needs params, layers, heads, head_dim, seq_len)"
            )
    params = _positive_number(where, "params", table["params"])
    ints = {key: _positive_int(where, key, table[key]) for key in _INT_KEYS}
    tokens = table.get("tokens_per_step")
    name = table.get("name", default_name)
    if not isinstance(name, str):
        raise BadInput(where, f"[model].name must be a string, got {name!r}")
    return ModelSpec(
        params=params,
        tokens_per_step=None if tokens is None else _positive_number(where, "tokens_per_step", tokens),
        name=name,
        **ints,
    )


def _positive_number(where: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise BadInput(where, f"[model].{key} must be a positive number, got {value!r}")
    return float(value)


def _positive_int(where: str, key: str, value: Any) -> int:
    number = _positive_number(where, key, value)
    if not number.is_integer():
        raise BadInput(where, f"[model].{key} must be a whole number, got {value!r}")
    return int(number)


def attention_flops_per_token(spec: ModelSpec) -> float:
    """12*L*H*Q*T: attention's QK^T and PV, forward and backward, per token."""
    return 12.0 * spec.layers * spec.heads * spec.head_dim * spec.seq_len


def flops_per_token(spec: ModelSpec) -> float:
    """Model FLOPs per token, 6N + 12*L*H*Q*T (PaLM App. B): the MFU numerator."""
    return 6.0 * spec.params + attention_flops_per_token(spec)


def executed_flops_per_token(spec: ModelSpec, recompute: Recompute) -> float:
    """FLOPs the hardware executes per token: the HFU numerator (Korthikanti et al. 2022).

    Recomputing a forward adds 2N (its GEMMs) and 4*L*H*Q*T (its attention core): full
    recomputation adds both, 8N + 16LHQT; selective adds only the attention core, 6N + 16LHQT.
    """
    attention_forward = attention_flops_per_token(spec) / 3
    if recompute == "none":
        return flops_per_token(spec)
    if recompute == "selective":
        return flops_per_token(spec) + attention_forward
    if recompute == "full":
        return flops_per_token(spec) + 2.0 * spec.params + attention_forward
    raise ValueError(f"recompute must be none, selective or full, got {recompute!r}")
