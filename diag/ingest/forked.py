"""The second half of a big trace's events, parsed in a forked child while this process parses
the first: one file's parse on two cores.

The child inherits the file's bytes (copy-on-write, or the same pages of the memory map), parses
its half and writes each table as an Arrow IPC stream into a private temporary folder; this
process, done with its own half, maps them back a table at a time, in order (memory holds the
mapped pages of one table's part rather than a half's Python objects). The child touches no
database and leaves only through os._exit, so nothing of the parent's (DuckDB's connection, its
threads) runs twice.

If the child fails in any way, this process parses the second half itself: the same events, the
same errors, as if it had never been split.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import pyarrow as pa

from diag.lifetime import die_with_parent, scratch_dir

if TYPE_CHECKING:
    from diag.ingest.kineto import KinetoFile

Parse = Callable[["KinetoFile", Counter[str]], Iterator[dict[str, pa.Table]]]


class SecondHalf:
    """`parse(info, bad)` run in a forked child from construction; `tables` yields its output."""

    def __init__(self, parse: Parse) -> None:
        self.parse = parse
        # Imported here so the child inherits it: pyarrow imports numpy.ma lazily at its first
        # conversion of a NumPy array, which both processes make at once after the fork (10 ms each).
        import numpy.ma  # noqa: F401

        self.dir = tempfile.mkdtemp(prefix="diag-half-", dir=scratch_dir())
        self.status = -1   # the child's wait status, once reaped
        parent = os.getpid()
        try:
            self.pid = os.fork()
        except OSError:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        if self.pid == 0:
            self._child(parent)

    def _child(self, parent: int) -> None:
        from diag.ingest.kineto import KinetoFile

        code = 1
        try:
            die_with_parent(parent)
            info, bad = KinetoFile.blank(), Counter[str]()
            writers: dict[str, pa.ipc.RecordBatchStreamWriter] = {}
            for tables in self.parse(info, bad):
                for name, t in tables.items():
                    if t.num_rows:
                        if name not in writers:
                            writers[name] = pa.ipc.new_stream(pa.OSFile(self._stream(name), "wb"), t.schema)
                        writers[name].write_table(t)
            for w in writers.values():
                w.close()
            Path(self.dir, "info.json").write_text(json.dumps({"info": info.counts(), "bad": bad,
                                                               "tables": list(writers)}))
            code = 0
        finally:
            os._exit(code)

    def _stream(self, name: str) -> str:
        return os.path.join(self.dir, f"{name}.arrows")

    def running(self) -> bool:
        """Whether the child is still parsing (if it has ended, it is reaped here and its status kept)."""
        if self.pid:
            pid, self.status = os.waitpid(self.pid, os.WNOHANG)
            if pid == 0:
                return True
            self.pid = 0
        return False

    def tables(self, info: KinetoFile, bad: Counter[str]) -> Iterator[dict[str, pa.Table]]:
        """The second half's tables (adding its counts to `info` and `bad`), once the child is done."""
        if self.pid:
            _, self.status = os.waitpid(self.pid, 0)
            self.pid = 0
        status = self.status
        done = Path(self.dir, "info.json")
        if status != 0 or not done.exists():
            yield from self.parse(info, bad)
            return
        out = json.loads(done.read_text())
        info.add_counts(out["info"])
        bad.update(out["bad"])
        for name in out["tables"]:
            # A table's whole part at once, mapped rather than read (no copy): the store then
            # inserts it in one statement, not a batch at a time. Inserting the second half of the
            # 307 MB trace one 16 MB flush at a time took 0.45 s of INSERTs, at once 0.30 s.
            with pa.memory_map(self._stream(name)) as f:
                yield {name: pa.ipc.open_stream(f).read_all()}

    def __enter__(self) -> SecondHalf:
        return self

    def cancel(self) -> None:
        """End the child: its tables will not be wanted."""
        if self.pid:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.pid = 0

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.cancel()   # left before the child's tables were wanted: it has nothing more to do
        shutil.rmtree(self.dir, ignore_errors=True)
