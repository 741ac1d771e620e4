"""Load a pickle that may only hold plain data, without ever running code from it.

A pickle is a program: GLOBAL / STACK_GLOBAL / INST / OBJ name a callable, REDUCE calls it. Every one
of those names goes through `Unpickler.find_class`, so an unpickler whose `find_class` always refuses
can build nothing but the containers and primitives the opcodes make themselves. Flight Recorder dumps
need no more: torch writes them from a c10::Dict of strings, ints, floats, bools, None, lists and
tuples (FlightRecorderDetail.hpp `dump_dict`; torch's own fr_trace loader calls plain `pickle.load`).

After loading, the object tree is checked against the file size, because memo references (BINGET)
let a few bytes stand for a container many times over: a legitimate dump costs at least one byte per
object, so a tree larger than the file is a bomb, and it is refused before anything walks it again.
"""

from __future__ import annotations

import io
import pickle

from diag.errors import BadInput

_PLAIN_TYPES = (dict, list, tuple, str, int, float, bool, type(None))
_KEY_TYPES = (str, int, float, bool, type(None))
# Flight Recorder entries nest 4 deep (dump → entries → entry → frames → frame); 64 is ample.
_MAX_DEPTH = 64
# Slack for tiny pickles, where the protocol header is a large share of the bytes.
_MIN_NODE_BUDGET = 1024


class PlainUnpickler(pickle.Unpickler):
    """Refuses every class or function a pickle asks for, so only plain data can be built."""

    def find_class(self, module: str, name: str) -> type:
        raise pickle.UnpicklingError(f"refused to import {module}.{name}")


def load_plain(path: str, data: bytes) -> object:
    """The pickled object, if it is made only of dicts, lists, tuples, strings, numbers, bools and None."""
    try:
        obj = PlainUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as e:
        reason = str(e)
        if reason.startswith("refused to import"):
            raise BadInput(
                path, f"unsafe pickle {reason}: only plain data is loaded, nothing in it was run"
            ) from None
        raise BadInput(path, f"not a readable pickle ({reason})") from None
    except EOFError:
        raise BadInput(path, "pickle ends early (truncated?)", len(data)) from None
    except (
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        AttributeError,
        OverflowError,
        UnicodeDecodeError,
    ) as e:
        # What the C unpickler raises on garbled opcodes and arguments.
        raise BadInput(path, f"not a readable pickle ({type(e).__name__}: {e})") from None
    _check_plain(path, obj, len(data))
    return obj


def _check_plain(path: str, root: object, n_bytes: int) -> None:
    node_budget = max(n_bytes, _MIN_NODE_BUDGET)
    stack: list[tuple[object, int]] = [(root, 0)]
    visited = 0
    while stack:
        node, depth = stack.pop()
        visited += 1
        if visited > node_budget:
            raise BadInput(
                path,
                f"pickle expands to more objects than its {n_bytes} bytes can hold (shared references); refused",
            )
        if depth > _MAX_DEPTH:
            raise BadInput(path, f"pickle nests deeper than {_MAX_DEPTH} levels; refused")
        if not isinstance(node, _PLAIN_TYPES):
            raise BadInput(path, f"pickle holds a {type(node).__name__}; only plain data is accepted")
        if isinstance(node, dict):
            for key, value in node.items():
                if not isinstance(key, _KEY_TYPES):
                    raise BadInput(
                        path,
                        f"pickle has a dict key of type {type(key).__name__}; only plain keys are accepted",
                    )
                stack.append((value, depth + 1))
        elif isinstance(node, list | tuple):
            stack.extend((item, depth + 1) for item in node)
