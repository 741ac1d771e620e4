"""An in-memory store opened in a thread while the command imports (store.connect_ahead): the next
connect(None) takes it, the same store it would have opened; a file store never does."""

from __future__ import annotations

import threading
from pathlib import Path

import duckdb
import pytest

from diag.runtime import store
from diag.runtime.errors import BadInput


def tables(con: duckdb.DuckDBPyConnection) -> list[str]:
    return [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall()]


def test_the_next_in_memory_connect_takes_the_store_opened_ahead() -> None:
    plain = store.connect(None)
    opened_in: list[str] = []
    connect = store._connect

    def spy(db: str | Path | None, read_only: bool) -> duckdb.DuckDBPyConnection:
        opened_in.append(threading.current_thread().name)
        return connect(db, read_only)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(store, "_connect", spy)
        store.connect_ahead()
        ahead = store.connect(None)
        again = store.connect(None)   # only the first takes it
    assert opened_in[0] != threading.main_thread().name and opened_in[1:] == [threading.main_thread().name]
    assert tables(ahead) == tables(plain) == tables(again) and "trace_files" in tables(ahead)
    assert ahead.execute("SELECT current_setting('checkpoint_threshold')").fetchone() == \
        plain.execute("SELECT current_setting('checkpoint_threshold')").fetchone()
    for con in (plain, ahead, again):
        con.close()


def test_a_file_store_is_opened_as_asked(tmp_path: Path) -> None:
    store.connect_ahead()
    con = store.connect(tmp_path / "x.duckdb")
    assert store.name(con) == str(tmp_path / "x.duckdb")
    con.close()
    store.connect(None).close()   # the one opened ahead, still there for the next in-memory connect
    assert store._memory_ahead is None


def test_a_failure_in_the_thread_is_raised_where_the_store_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(db: str | Path | None, read_only: bool) -> duckdb.DuckDBPyConnection:
        raise BadInput("the store", "cannot open the store: out of memory")

    monkeypatch.setattr(store, "_connect", fail)
    store.connect_ahead()
    with pytest.raises(BadInput, match="out of memory"):
        store.connect(None)
