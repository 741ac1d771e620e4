-- diag analysis tables, run level: rebuilt by every `diag analyze` from the per-rank tables of
-- rank_tables.sql (the map step) and the matching across ranks (the reduce).
-- Times are ns on the rank's own clock unless a column says `aligned` (+ clock_offsets.offset_ns).
-- docs/ledger.md gives the arithmetic.

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

-- Clock offset of each rank against the reference rank (the lowest), from the ends of matched
-- collectives and send/recv pairs (clocks.py).
CREATE OR REPLACE TABLE clock_offsets (
    rank         INTEGER,
    offset_ns    BIGINT,       -- add to this rank's times to put them on the reference clock
    n_matches    INTEGER,      -- matched instances behind the estimate that linked this rank
    spread_ns    BIGINT,       -- median absolute deviation of those per-instance estimates
    residual_ns  BIGINT        -- median |estimate − solution| over every estimate involving this rank
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

-- The cross-rank critical path of each step (diag/attribution/critical_path.py, docs/critical_path.md): its
-- segments in time order, adjacent ones of one rank and kind merged. Times on the aligned clock.
CREATE OR REPLACE TABLE critical_path (
    step      INTEGER,     -- N of ProfilerStep#N
    seq       INTEGER,     -- position on the path, 0 = earliest
    rank      INTEGER,
    kind      VARCHAR,     -- compute | comm | wait | copy | idle | host
    start_ns  BIGINT,      -- aligned (+ clock_offsets.offset_ns)
    end_ns    BIGINT,
    what      VARCHAR      -- collective instance (comm, wait), 'dataloader' | 'launch' (host), else the kernel or
                           -- copy that ran longest in it (NULL: none its step launched)
);
