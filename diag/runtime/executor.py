"""Where the map step runs: spawned processes on this machine (`local`), or Ray tasks (`ray`).

An executor applies a top-level function to each argument tuple and yields the results in input
order, with at most `in_flight` calls outstanding, so whatever the calls leave on disk (ingest's
Parquet spills) stays bounded however many files there are. A call must not touch anything the
parent holds open: while the parent has the DuckDB store read-write no other process can open it
at all (DESIGN.md), so map calls write files and return small values, and the parent alone writes
the store.

- `local`: a pool of spawned processes. Spawn, not fork: the parent holds a DuckDB connection
  and its threads, which a fork would copy in whatever state they are in.
- `ray`: one Ray task per call, on the cluster `RAY_ADDRESS` names, else on a Ray started here
  for this executor's lifetime. Arguments and results travel through Ray's object store (they
  are small); the files a task reads and writes travel by path, so on a cluster of several
  machines the traces and the spill directory must be on storage that every node and the parent
  mount at the same path (NFS, Lustre, a shared bucket mount). The traces have to be there
  anyway for the tasks to read them.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, Generic, TypeVar

from diag.runtime.lifetime import die_with_parent
from diag.runtime.no_pandas import keep_pandas_out

EXECUTORS = ("local", "ray")
R = TypeVar("R")
H = TypeVar("H")  # a submitted call's handle: a Future, a Ray ObjectRef

# A Ray started by diag for one run is sized for the map step's needs: its results are a file's
# row and some paths (a few kB each), so 128 MiB of object store is plenty, where Ray's default is
# 30% of the machine's memory.
_LOCAL_RAY_OBJECT_STORE_BYTES = 128 * 1024**2


class Executor(Generic[H]):
    """Runs calls somewhere else; `workers` of them at a time."""

    name = ""

    def __init__(self, workers: int) -> None:
        self.workers = max(1, workers)

    def imap(self, fn: Callable[..., R], calls: Iterable[tuple[Any, ...]], in_flight: int | None = None) -> Iterator[R]:
        """fn(*args) for each args, in order; at most `in_flight` (default 2 × workers, so a
        worker always has its next call queued while the parent consumes a result) outstanding."""
        window = max(1, in_flight or 2 * self.workers)
        pending: deque[H] = deque()
        try:
            for args in calls:
                pending.append(self._submit(fn, args))
                if len(pending) >= window:
                    yield self._result(pending.popleft())
            while pending:
                yield self._result(pending.popleft())
        finally:
            for h in pending:
                self._cancel(h)

    def _submit(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> H:
        raise NotImplementedError

    def _result(self, handle: H) -> Any:
        raise NotImplementedError

    def _cancel(self, handle: H) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Executor[H]:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            self._abort()
        self.close()

    def _abort(self) -> None:
        """Left by an exception (SIGTERM, Ctrl-C, an error): stop the calls in flight, not wait for them."""


class LocalExecutor(Executor["Future[Any]"]):
    name = "local"

    def __init__(self, workers: int | None = None) -> None:
        super().__init__(workers or os.cpu_count() or 1)
        self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"),
                                         initializer=_start_worker, initargs=(os.getpid(),))

    def _submit(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Future[Any]:
        return self._pool.submit(fn, *args)

    def _result(self, handle: Future[Any]) -> Any:
        return handle.result()

    def _cancel(self, handle: Future[Any]) -> None:
        handle.cancel()

    def _abort(self) -> None:
        # ProcessPoolExecutor can only wait for running calls (terminate_workers is Python 3.14).
        for p in list(getattr(self._pool, "_processes", {}).values()):
            p.kill()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def _start_worker(parent_pid: int) -> None:
    """A local worker dies with this process, even killed outright (diag/runtime/lifetime.py), and parses
    without pandas: pyarrow would import it at the worker's first table (diag/runtime/no_pandas.py)."""
    die_with_parent(parent_pid)
    keep_pandas_out()


class RayExecutor(Executor[Any]):
    """Ray tasks of one CPU each. Joins the cluster at `RAY_ADDRESS`, or a Ray already started in
    this process (tests start one), or else starts a local one with `workers` CPUs and stops it
    at close."""

    name = "ray"

    def __init__(self, workers: int | None = None) -> None:
        try:
            import ray
        except ImportError:
            from diag.runtime.errors import BadInput

            raise BadInput("--executor ray", "Ray is not installed: pip install 'diag[ray]' (or 'ray>=2.9')") from None
        self._ray = ray
        self._owns = not ray.is_initialized()
        if self._owns:
            address = os.environ.get("RAY_ADDRESS")
            if address:
                ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
            else:
                # "local" starts a fresh instance instead of joining whatever `ray start` left running.
                ray.init(address="local", num_cpus=workers or os.cpu_count() or 1,
                         object_store_memory=_LOCAL_RAY_OBJECT_STORE_BYTES, include_dashboard=False,
                         log_to_driver=False, logging_level=logging.ERROR)
        super().__init__(workers or int(ray.cluster_resources().get("CPU", 1)))
        self._remote: dict[Callable[..., Any], Any] = {}

    def _submit(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        if fn not in self._remote:
            # max_retries=0: a call that fails (or a worker killed for memory) is reported for its
            # file, not run again on the same input.
            self._remote[fn] = self._ray.remote(num_cpus=1, max_retries=0)(fn)
        return self._remote[fn].remote(*args)

    def _result(self, handle: Any) -> Any:
        return self._ray.get(handle)

    def _cancel(self, handle: Any) -> None:
        self._ray.cancel(handle)

    def close(self) -> None:
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()


def make_executor(kind: str, workers: int | None = None) -> Executor[Any]:
    """`kind` is one of EXECUTORS; `workers` defaults to this machine's cores (local) or the
    cluster's CPUs (ray)."""
    if kind == "local":
        return LocalExecutor(workers)
    if kind == "ray":
        return RayExecutor(workers)
    raise ValueError(f"unknown executor {kind!r}: one of {', '.join(EXECUTORS)}")
