"""The subcommands beyond `ingest`, each registered from the module that implements it."""

from __future__ import annotations

import argparse
from collections.abc import Callable

Register = Callable[[argparse._SubParsersAction], None]  # type: ignore[type-arg]

REGISTER: tuple[Register, ...] = ()
