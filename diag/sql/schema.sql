-- diag store schema, version 1.
--
-- Every time is an integer number of nanoseconds on the clock of the rank that recorded it,
-- exactly as written in the trace (Kineto writes microseconds with up to three decimals;
-- we multiply by 1000 and round). Cross-rank work adds `clock_offsets.offset_ns` (timeline.py).
-- Every event of a file lands in exactly one table below; `trace_files.n_events` is their total,
-- so a test can prove nothing was lost or counted twice.
-- `args` columns hold the event's `args` object verbatim as JSON text; the typed columns beside
-- them are the keys diag reads (NULL where the event does not carry them).

CREATE SEQUENCE IF NOT EXISTS file_id_seq START 1;

-- One row per ingested file (Kineto trace or NCCL-side dump).
CREATE TABLE IF NOT EXISTS trace_files (
    file_id          INTEGER PRIMARY KEY,   -- dense id, referenced by every event table
    path             VARCHAR NOT NULL,      -- absolute path at ingest time
    content_hash     VARCHAR NOT NULL UNIQUE, -- sha256 (hex) of the decompressed bytes: re-ingest adds 0 rows
    kind             VARCHAR NOT NULL,      -- 'kineto' | 'flight_recorder' | 'nccl_inspector' | 'nccl_profiler'
    rank             INTEGER,               -- global rank (NULL only for NCCL-side files that carry none)
    rank_source      VARCHAR,               -- 'distributedInfo' | 'filename' | 'option' | 'content' | 'process' (by hostname, pid) | 'merged' (one rank of a merged file)
    world_size       INTEGER,               -- distributedInfo.world_size (NULL when absent)
    capture_window   INTEGER,               -- 0,1,2.. per rank, in order of the window's first timestamp
    backend          VARCHAR,               -- distributedInfo.backend ('nccl', 'gloo', ...)
    device_name      VARCHAR,               -- deviceProperties[i].name of the device the kernels ran on
    device_props     JSON,                  -- deviceProperties verbatim (list)
    distributed_info JSON,                  -- distributedInfo verbatim (pg_config included)
    schema_version   INTEGER,               -- schemaVersion (NULL in the 2021 schema)
    schema_era       VARCHAR,               -- '2021' (Operator/Runtime/Kernel) or 'current' (cpu_op/kernel/...)
    time_unit        VARCHAR,               -- displayTimeUnit as written ('ms', 'ns' or NULL); ts is µs regardless
    base_time_ns     BIGINT,                -- baseTimeNanoseconds (NULL when absent)
    first_ts_ns      BIGINT,                -- earliest event start in the file
    last_ts_ns       BIGINT,                -- latest event end in the file
    n_events         BIGINT NOT NULL,       -- Kineto: events read (all phases) = sum of rows over the event tables; NCCL-side: nccl_ops rows
    has_gpu          BOOLEAN NOT NULL,      -- any kernel, memcpy or memset event
    partial          BOOLEAN NOT NULL,      -- --salvage kept only the complete events before damage
    damage_offset    BIGINT,                -- byte offset of the damage in the decompressed text, when partial
    warnings         JSON,                  -- list of one-line warnings raised while ingesting
    ingested_at      TIMESTAMP NOT NULL
);
-- Where the last read of a file stopped (added after version 1; old stores gain them here). A file
-- seen again at the same path is read on from read_bytes when its first read_bytes still hash to
-- read_hash (an NCCL Inspector log the job appends to), and is otherwise a new file that replaces this one.
ALTER TABLE trace_files ADD COLUMN IF NOT EXISTS read_bytes BIGINT;   -- decompressed bytes read (to the end of the last complete record)
ALTER TABLE trace_files ADD COLUMN IF NOT EXISTS read_hash VARCHAR;   -- sha256 (hex) of those bytes
ALTER TABLE trace_files ADD COLUMN IF NOT EXISTS read_state JSON;     -- what the parser carries to the next read (NULL: the format is read whole)

-- CPU-side spans: cpu_op / Operator, user_annotation, python_function and any other host 'X'
-- event that is not a runtime/driver call. ProfilerStep#N, Optimizer.step#..., DataLoader and
-- record_param_comms live here.
CREATE TABLE IF NOT EXISTS cpu_ops (
    file_id      INTEGER NOT NULL,
    rank         INTEGER,
    cat          VARCHAR,        -- 'cpu_op', 'user_annotation', 'python_function', 'Operator', ...
    name         VARCHAR,
    pid          BIGINT,
    tid          BIGINT,
    ts_ns        BIGINT NOT NULL,
    dur_ns       BIGINT NOT NULL,
    external_id  BIGINT,         -- args["External id"]: links to the runtime calls it issued
    seq_num      BIGINT,         -- args["Sequence number"]: forward op ↔ its backward
    fwd_tid      BIGINT,         -- args["Fwd thread id"]: set on ops run by the autograd engine
    input_dims   JSON,           -- args["Input Dims"] (record_shapes)
    input_types  JSON,           -- args["Input type"]
    trace_flops  DOUBLE,         -- args["flops"] where the profiler computed it (with_flops)
    args         JSON /*raw_text_compression*/
);

-- GPU-side annotations (gpu_user_annotation): drawn only over kernels launched directly under
-- the CPU range, so never used for step extents.
CREATE TABLE IF NOT EXISTS gpu_annotations (
    file_id     INTEGER NOT NULL,
    rank        INTEGER,
    name        VARCHAR,
    device      INTEGER,
    stream      BIGINT,
    ts_ns       BIGINT NOT NULL,
    dur_ns      BIGINT NOT NULL,
    external_id BIGINT,
    args        JSON /*raw_text_compression*/
);

-- Host launches: cuda_runtime / cuda_driver / Runtime (2021) and cuda_sync events.
CREATE TABLE IF NOT EXISTS runtime_calls (
    file_id     INTEGER NOT NULL,
    rank        INTEGER,
    cat         VARCHAR,         -- 'cuda_runtime' | 'cuda_driver' | 'Runtime' | 'cuda_sync' | ...
    name        VARCHAR,         -- cudaLaunchKernel, cudaLaunchKernelExC, cuLaunchKernelEx, ...
    pid         BIGINT,
    tid         BIGINT,
    ts_ns       BIGINT NOT NULL,
    dur_ns      BIGINT NOT NULL,
    correlation BIGINT,          -- args.correlation: equals the correlation of what it launched
    external_id BIGINT,          -- args["External id"] (2021: args["external id"]): the CPU op above it
    cbid        INTEGER,
    args        JSON /*raw_text_compression*/
);

-- Device kernels (kernel / Kernel).
CREATE TABLE IF NOT EXISTS kernels (
    file_id     INTEGER NOT NULL,
    rank        INTEGER,
    name        VARCHAR,
    device      INTEGER,
    stream      BIGINT,
    ts_ns       BIGINT NOT NULL,
    dur_ns      BIGINT NOT NULL,
    correlation BIGINT,
    external_id BIGINT,
    grid        JSON,
    block       JSON,
    args        JSON /*raw_text_compression*/
);

-- Device copies and memsets (gpu_memcpy / Memcpy, gpu_memset / Memset).
CREATE TABLE IF NOT EXISTS copies (
    file_id     INTEGER NOT NULL,
    rank        INTEGER,
    kind        VARCHAR,         -- 'memcpy' | 'memset'
    name        VARCHAR,         -- e.g. 'Memcpy HtoD (Pageable -> Device)'
    device      INTEGER,
    stream      BIGINT,
    ts_ns       BIGINT NOT NULL,
    dur_ns      BIGINT NOT NULL,
    correlation BIGINT,
    external_id BIGINT,
    bytes       BIGINT,
    args        JSON /*raw_text_compression*/
);

-- Flow events ('s', 'f', 't'): ac2g / async_cpu_to_gpu / async_gpu launch arrows, fwdbwd links.
CREATE TABLE IF NOT EXISTS flows (
    file_id INTEGER NOT NULL,
    rank    INTEGER,
    cat     VARCHAR,
    name    VARCHAR,
    ph      VARCHAR,                 -- 's' start, 'f' finish, 't' step
    flow_id VARCHAR,                 -- the id as text: flow ids can exceed 64 bits
    pid     BIGINT,
    tid     BIGINT,
    ts_ns   BIGINT,
    args    JSON /*raw_text_compression*/
);

-- NCCL collective arguments, from record_param_comms CPU ops and from kernels that carry them.
CREATE TABLE IF NOT EXISTS collective_args (
    file_id          INTEGER NOT NULL,
    rank             INTEGER,
    source           VARCHAR,    -- 'cpu_op' (record_param_comms) | 'kernel'
    external_id      BIGINT,
    correlation      BIGINT,     -- for source = 'kernel'
    tid              BIGINT,
    ts_ns            BIGINT,
    dur_ns           BIGINT,
    collective       VARCHAR,    -- args["Collective name"]: allreduce, allgather, _reduce_scatter_base, send, recv ...
    pg_name          VARCHAR,    -- args["Process Group Name"]
    pg_desc          VARCHAR,    -- args["Process Group Description"]
    pg_ranks         INTEGER[],  -- args["Process Group Ranks"], "[0, 1, ..., N]" expanded where unambiguous
    pg_ranks_truncated BOOLEAN,  -- the list was written truncated ("...") and could not be expanded exactly
    group_size       INTEGER,    -- args["Group size"]
    in_nelems        BIGINT,     -- args["In msg nelems"]
    out_nelems       BIGINT,     -- args["Out msg nelems"]
    dtype            VARCHAR,    -- args["dtype"]
    seq              BIGINT,     -- args["Seq"] (per process group, when present)
    global_rank_start  INTEGER,
    global_rank_stride INTEGER,
    in_split         JSON,
    out_split        JSON,
    peer_rank        INTEGER     -- send/recv: the other side's global rank ("Dst/Src Rank", or "Rank" in the group)
);

-- Counters ('C') and instants ('i', 'I'), metadata ('M') and anything else we do not type.
CREATE TABLE IF NOT EXISTS other_events (
    file_id INTEGER NOT NULL,
    rank    INTEGER,
    ph      VARCHAR,
    cat     VARCHAR,
    name    VARCHAR,
    pid     VARCHAR,                 -- text: 'Spans', 'Traces' and '' occur beside integers
    tid     VARCHAR,
    ts_ns   BIGINT,
    dur_ns  BIGINT,
    args    JSON /*raw_text_compression*/
);

-- NCCL-side records (Flight Recorder, NCCL Inspector, NCCL example profiler plugin), one row per
-- collective or point-to-point operation as that source saw it. Joined to `collective_args`
-- by (rank, pg_name, seq) where both carry them (timeline.py).
CREATE TABLE IF NOT EXISTS nccl_ops (
    file_id      INTEGER NOT NULL,
    rank         INTEGER,        -- global rank of the recording process
    source       VARCHAR NOT NULL, -- 'flight_recorder' | 'nccl_inspector' | 'nccl_profiler'
    record_idx   BIGINT NOT NULL,  -- FR: index into `entries`; Inspector: 0-based line; profiler: index of the op's begin event
    pg_name      VARCHAR,        -- process group name (FR) or communicator id/hash (NCCL-side)
    pg_desc      VARCHAR,
    comm_id      VARCHAR,        -- communicator hash / id as text (can exceed 64 bits)
    n_ranks      INTEGER,        -- communicator size
    collective   VARCHAR,        -- normalized: allreduce, allgather, reducescatter, broadcast, reduce, alltoall, send, recv
    seq          BIGINT,         -- collective sequence id within the group (FR collective_seq_id, Inspector seq)
    p2p_seq      BIGINT,
    in_nelems    BIGINT,
    out_nelems   BIGINT,
    msg_bytes    BIGINT,
    dtype        VARCHAR,
    state        VARCHAR,        -- FR: scheduled | started | completed
    start_ns     BIGINT,         -- on the source's own clock (see `source`); FR: when the work was enqueued
    end_ns       BIGINT,
    duration_ns  BIGINT,
    algo_bw_gbps DOUBLE,         -- GB/s (10^9 bytes/s)
    bus_bw_gbps  DOUBLE,         -- GB/s (10^9 bytes/s), NCCL's bus bandwidth
    algorithm    VARCHAR,        -- RING / TREE / NVLS ... where the source says
    protocol     VARCHAR,        -- LL / LL128 / SIMPLE
    n_channels   INTEGER,
    record       JSON            -- the source record verbatim (as JSON)
);
