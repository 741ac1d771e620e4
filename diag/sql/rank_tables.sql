-- diag analysis tables, per trace file (rank and capture window): filled by the map step of
-- `diag analyze` one file at a time (diag/engine/run.py). Recreated by a full analysis; a live
-- session adds the rows of each new file only.
-- Times are ns on the rank's own clock. docs/ledger.md gives the arithmetic.

-- One row per rank and step: the step's GPU window (docs/ledger.md "Steps").
CREATE OR REPLACE TABLE steps (
    file_id        INTEGER,
    rank           INTEGER,
    capture_window INTEGER,
    step           INTEGER,   -- N of ProfilerStep#N (0.. per capture when the trace has none)
    cpu_start_ns   BIGINT,    -- the CPU ProfilerStep span
    cpu_end_ns     BIGINT,
    start_ns       BIGINT,    -- the GPU window: tiles the timeline
    end_ns         BIGINT,
    n_kernels      INTEGER,   -- GPU activities launched from inside the CPU span
    from_profiler_step BOOLEAN -- false: no ProfilerStep in the trace, one window per capture
);

-- One row per GPU activity (kernel, memcpy, memset) with what diag derived for it.
CREATE OR REPLACE TABLE activities (
    file_id     INTEGER,
    idx         INTEGER,       -- position in the rank's timeline: the i of evidence ids act:<file_id>:<i>
    rank        INTEGER,
    step        INTEGER,       -- the step whose CPU span launched it (NULL: launched outside any)
    source      VARCHAR,       -- 'kernel' | 'memcpy' | 'memset'
    name        VARCHAR,
    kclass      VARCHAR,       -- gemm | attention | comm | copy | memset | other (diag/knowledge/kernels.py)
    collective  VARCHAR,       -- for comm kernels: allreduce, allgather, ..., sendrecv
    stream      BIGINT,
    ts_ns       BIGINT,
    end_ns      BIGINT,
    correlation BIGINT,
    launch_ts_ns  BIGINT,      -- the runtime/driver call that launched it (matched by correlation)
    launch_end_ns BIGINT,
    op_name     VARCHAR,       -- innermost CPU op above the launch (External id)
    phase       VARCHAR,       -- forward | backward | recompute | optimizer | dataloader | other
    flops       DOUBLE,        -- from the op's shapes (diag/knowledge/flops.py), split over its matmul kernels
    gemm_m      BIGINT,
    gemm_n      BIGINT,
    gemm_k      BIGINT,
    dtype       VARCHAR,
    bytes_moved DOUBLE,        -- operand bytes read + written, where the shapes give them
    trace_flops DOUBLE         -- the profiler's own `flops` arg on the op, when recorded
);

-- Merged runs of one GPU state, for drawing lanes.
CREATE OR REPLACE TABLE gpu_segments (
    file_id  INTEGER,
    rank     INTEGER,
    step     INTEGER,
    start_ns BIGINT,
    end_ns   BIGINT,
    state    VARCHAR           -- compute | comm | copy | idle
);
