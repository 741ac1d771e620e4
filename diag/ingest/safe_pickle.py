"""Load a pickle that may only hold plain data, without ever running code from it.

A pickle is a program: GLOBAL / STACK_GLOBAL / INST / OBJ name a callable, REDUCE calls it. Every one
of those names goes through `Unpickler.find_class`, so an unpickler whose `find_class` always refuses
can build nothing but the containers and primitives the opcodes make themselves. Flight Recorder dumps
need no more: torch writes them from a c10::Dict of strings, ints, floats, bools, None, lists and
tuples (FlightRecorderDetail.hpp `dump_dict`; torch's own fr_trace loader calls plain `pickle.load`).

After loading, the tree is measured as JSON would write it out, where every reference to a shared
container (a memo BINGET) copies it again. Real dumps share a little: torch pickles one dict per
distinct stack frame and every entry that has the frame refers to it, so the torch 2.13 dump in
tests/data/nccl expands to 0.16 objects per byte. A few bytes of references can stand for 10**30
objects, so more than `_MAX_OBJECTS_PER_BYTE` per byte is refused before anything walks it again.
"""

from __future__ import annotations

import io
import itertools
import pickle
import struct
from collections.abc import Iterator

from diag.runtime.errors import BadInput, in_words

_CONTAINERS = (dict, list, tuple)
_LEAVES = (str, int, float, bool, type(None))
# A shared frame costs the most per byte: a 2-byte BINGET for a dict of 3 keys and 3 values,
# 7 objects, 3.5 per byte. 32 leaves room above that; a bomb needs orders of magnitude more.
_MAX_OBJECTS_PER_BYTE = 32
# Flight Recorder entries nest 4 deep (dump → entries → entry → frames → frame); 64 is ample.
_MAX_DEPTH = 64
# Elements in one list, tuple or dict. Flight Recorder keeps a ring of TORCH_NCCL_TRACE_BUFFER_SIZE
# entries (2000 by default; jobs raise it to tens of thousands), and an entry's lists (sizes, frames)
# are far shorter: 10**6 is 500 × the default ring.
MAX_ELEMENTS = 1_000_000
# Slack for tiny pickles, where the protocol header is a large share of the bytes.
_MIN_BYTES = 1024


class PlainUnpickler(pickle._Unpickler):
    """Refuses every class or function a pickle asks for, so only plain data can be built.

    The pure-Python unpickler, not the C one: the C one sizes its memo by the largest index a
    LONG_BINPUT names, so 5 bytes of a damaged dump made it zero 10 GB (index 611,411,317) before
    anything could check. This one keeps the memo in a dict. It reads a 2000-entry dump in 28 ms
    where the C one takes 7."""

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
    except MemoryError:
        raise BadInput(path, "pickle asks for more memory than there is (damaged or hostile)") from None
    except (
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        AttributeError,
        OverflowError,
        UnicodeDecodeError,
        struct.error,
        RecursionError,
    ) as e:
        # What the C unpickler raises on garbled opcodes and arguments.
        raise BadInput(path, f"not a readable pickle ({in_words(e)})") from None
    expanded_size(path, obj, _MAX_OBJECTS_PER_BYTE * max(len(data), _MIN_BYTES))
    return obj


def expanded_size(path: str, root: object, max_objects: int) -> int:
    """How many objects `root` stands for when every reference to a shared container copies it.

    Memoized per container, so a bomb costs one visit per distinct object, not per copy; a container
    that contains itself, a non-plain object, a container of more than MAX_ELEMENTS or more than
    `max_objects` objects in all is refused. The walk holds one iterator per level, never a
    container's children copied out: a list of 20 M zeros (a 40 MB pickle) peaked at 1.9 GB that way.
    """
    if not isinstance(root, _CONTAINERS):
        _leaf(path, root)
        return 1
    size: dict[int, int] = {}
    # The path from the root: each container, its children still to visit, and its count so far.
    stack: list[tuple[_Container, Iterator[object], int]] = [(root, _children(path, root), 1)]
    on_path = {id(root)}
    while stack:
        node, todo, count = stack[-1]
        child = next(todo, _DONE)
        if child is _DONE:
            stack.pop()
            on_path.discard(id(node))
            size[id(node)] = count
            if stack:
                parent, rest, parent_count = stack[-1]
                stack[-1] = (parent, rest, _checked(path, parent_count + count, max_objects))
            continue
        if not isinstance(child, _CONTAINERS):
            _leaf(path, child)
            stack[-1] = (node, todo, _checked(path, count + 1, max_objects))
        elif id(child) in size:
            stack[-1] = (node, todo, _checked(path, count + size[id(child)], max_objects))
        elif id(child) in on_path:
            raise BadInput(path, "pickle holds a container that contains itself; refused")
        elif len(stack) >= _MAX_DEPTH:
            raise BadInput(path, f"pickle nests deeper than {_MAX_DEPTH} levels; refused")
        else:
            on_path.add(id(child))
            stack.append((child, _children(path, child), 1))
    return size[id(root)]


_DONE = object()
_Container = dict[object, object] | list[object] | tuple[object, ...]


def _leaf(path: str, node: object) -> None:
    if not isinstance(node, _LEAVES):
        raise BadInput(path, f"pickle holds a {type(node).__name__}; only plain data is accepted")


def _checked(path: str, count: int, max_objects: int) -> int:
    if count > max_objects:
        raise BadInput(path, f"pickle expands to more than {max_objects} objects (shared references); refused")
    return count


def _children(path: str, node: _Container) -> Iterator[object]:
    """A container's values, dict keys included (they are objects in the output too)."""
    if len(node) > MAX_ELEMENTS:
        raise BadInput(path, f"pickle holds a {type(node).__name__} of {len(node)} elements, more than the "
                             f"{MAX_ELEMENTS} a Flight Recorder dump can hold; refused")
    if not isinstance(node, dict):
        return iter(node)
    for key in node:
        if not isinstance(key, _LEAVES):
            raise BadInput(
                path, f"pickle has a dict key of type {type(key).__name__}; only plain keys are accepted"
            )
    return itertools.chain(node.keys(), node.values())
