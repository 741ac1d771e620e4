-- diag analysis tables: rebuilt by `diag analyze` from the event tables of schema.sql.
-- Times are ns on the rank's own clock unless a column says `aligned` (+ clock_offsets.offset_ns).
-- docs/ledger.md gives the arithmetic.

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
    kclass      VARCHAR,       -- gemm | attention | comm | copy | memset | other (diag/kernels.py)
    collective  VARCHAR,       -- for comm kernels: allreduce, allgather, ..., sendrecv
    stream      BIGINT,
    ts_ns       BIGINT,
    end_ns      BIGINT,
    correlation BIGINT,
    launch_ts_ns  BIGINT,      -- the runtime/driver call that launched it (matched by correlation)
    launch_end_ns BIGINT,
    op_name     VARCHAR,       -- innermost CPU op above the launch (External id)
    phase       VARCHAR,       -- forward | backward | recompute | optimizer | dataloader | other
    flops       DOUBLE,        -- from the op's shapes (diag/flops.py), split over its matmul kernels
    gemm_m      BIGINT,
    gemm_n      BIGINT,
    gemm_k      BIGINT,
    dtype       VARCHAR,
    bytes_moved DOUBLE,        -- operand bytes read + written, where the shapes give them
    trace_flops DOUBLE         -- the profiler's own `flops` arg on the op, when recorded
);

-- One row per collective call per rank (communication kernels), matched across ranks.
CREATE OR REPLACE TABLE collectives (
    file_id      INTEGER,
    rank         INTEGER,
    step         INTEGER,
    pg_name      VARCHAR,
    pg_desc      VARCHAR,
    collective   VARCHAR,
    seq          BIGINT,       -- Seq when the trace records it
    ordinal      BIGINT,       -- position of this call within its process group on this rank
    instance     VARCHAR,      -- match key across ranks: pg|seq or pg|collective|ordinal
    group_size   INTEGER,
    group_ranks  VARCHAR,      -- the participating global ranks, as text
    msg_bytes    BIGINT,       -- bytes of the larger of input/output message
    dtype        VARCHAR,
    ts_ns        BIGINT,
    end_ns       BIGINT,
    aligned_ts_ns  BIGINT,
    aligned_end_ns BIGINT,
    wait_ns      BIGINT,       -- time in the kernel before the last rank arrived: dur − min dur of the instance
    transfer_ns  BIGINT,       -- dur − wait
    last_rank    INTEGER,      -- the rank that arrived last (shortest kernel)
    n_matched    INTEGER,      -- ranks of this instance present in the traces
    algbw_gbps   DOUBLE,       -- msg_bytes / transfer time
    busbw_gbps   DOUBLE        -- algbw × NCCL's bus factor (all-reduce 2(n-1)/n, ...)
);

-- Clock offset of each rank against the reference rank (the lowest), from matched collective ends.
CREATE OR REPLACE TABLE clock_offsets (
    rank       INTEGER,
    offset_ns  BIGINT,         -- add to this rank's times to put them on the reference clock
    n_matches  INTEGER,        -- matched collective instances behind the estimate
    spread_ns  BIGINT          -- median absolute deviation of the per-instance estimates
);

-- Per rank and step: the four GPU states and the measures the ledger claims from.
CREATE OR REPLACE TABLE gpu_states (
    file_id       INTEGER,
    rank          INTEGER,
    step          INTEGER,
    window_ns     BIGINT,
    compute_ns    BIGINT,
    comm_ns       BIGINT,
    copy_ns       BIGINT,
    idle_ns       BIGINT,
    matmul_ns     BIGINT,      -- compute with a GEMM or attention kernel running
    non_matmul_ns BIGINT,
    p2p_only_ns   BIGINT,      -- comm-only with only send/recv running
    wait_ns       BIGINT,      -- comm-only inside a collective's wait for the last rank
    dataloader_ns BIGINT,      -- idle while the host is in the data loader
    host_bound_ns BIGINT,      -- idle before the next launch call returned
    recompute_ns  BIGINT,      -- compute while recomputed forward work runs (the recompute claim without a peak)
    model_flops   DOUBLE,
    exec_flops    DOUBLE,      -- matmul + attention FLOPs executed (recompute included)
    recompute_flops DOUBLE,
    fwd_flops     DOUBLE
);

-- Merged runs of one GPU state, for drawing lanes.
CREATE OR REPLACE TABLE gpu_segments (
    rank     INTEGER,
    step     INTEGER,
    start_ns BIGINT,
    end_ns   BIGINT,
    state    VARCHAR           -- compute | comm | copy | idle
);

-- The ledger: per rank and step, the twelve buckets of DESIGN.md, in seconds and fractions.
CREATE OR REPLACE TABLE ledger (
    rank     INTEGER,
    step     INTEGER,
    bucket   VARCHAR,
    seconds  DOUBLE,
    fraction DOUBLE
);

-- Kineto collectives joined to what NCCL-side traces recorded of the same call: by rank, process
-- group and Seq (Flight Recorder's collective_seq_id counts per group as PyTorch's Seq does).
-- NCCL Inspector and the profiler plugin number calls by communicator, not by process group, so
-- they stay in nccl_ops on their own.
CREATE OR REPLACE VIEW collectives_nccl AS
SELECT c.rank, c.step, c.pg_name, c.collective, c.seq, c.ts_ns, c.end_ns, c.wait_ns, c.busbw_gbps,
       n.source AS nccl_source, n.collective AS nccl_collective, n.state AS nccl_state,
       n.duration_ns AS nccl_duration_ns, n.msg_bytes AS nccl_msg_bytes, n.bus_bw_gbps AS nccl_bus_bw_gbps
FROM collectives c
JOIN nccl_ops n ON n.rank = c.rank AND n.pg_name = c.pg_name AND n.seq = c.seq AND n.source = 'flight_recorder';
