-- The queries behind the TUI's views, over the analysis tables (diag/sql/rank_tables.sql, analysis.sql) and the
-- event tables (diag/sql/schema.sql). Each block starts with `-- name: <query>` and takes DuckDB
-- named parameters ($rank, ...). Every list a view shows is aggregated or limited here: a
-- Textual DataTable takes ~1.6 s to fill with 10k rows (DESIGN.md), so no query returns more
-- than ~1k rows.
-- `aligned` times add clock_offsets.offset_ns to put every rank on the reference rank's clock.

-- name: heat_cells
-- Rank × step values for the heatmap: the step time (s) and each ledger bucket (fraction of the step).
SELECT rank, step, 'step_time' AS metric, window_ns * 1e-9 AS value FROM gpu_states
UNION ALL
SELECT rank, step, bucket AS metric, fraction AS value FROM ledger
ORDER BY metric, rank, step;

-- name: step_windows
-- The GPU window of one step on every rank that has it, aligned.
SELECT s.rank, s.start_ns + coalesce(o.offset_ns, 0) AS start_ns, s.end_ns + coalesce(o.offset_ns, 0) AS end_ns
FROM steps s LEFT JOIN clock_offsets o USING (rank)
WHERE s.step = $step
ORDER BY s.rank;

-- name: lane_segments
-- The merged GPU-state runs of one step for some ranks, aligned (states.py: compute|comm|copy|idle).
SELECT g.rank, g.start_ns + coalesce(o.offset_ns, 0) AS start_ns, g.end_ns + coalesce(o.offset_ns, 0) AS end_ns,
       g.state
FROM gpu_segments g LEFT JOIN clock_offsets o USING (rank)
WHERE g.step = $step AND list_contains($ranks, g.rank)
ORDER BY g.rank, g.start_ns;

-- name: lane_path
-- The step's critical path (diag/attribution/critical_path.py) on some ranks: the time of each rank the step
-- waited on, with its kind (compute|comm|wait|copy|idle|host). Already aligned.
SELECT rank, start_ns, end_ns, kind
FROM critical_path
WHERE step = $step AND list_contains($ranks, rank)
ORDER BY rank, start_ns;

-- name: lane_phases
-- What the host was doing, per rank: runs of consecutive launches from one phase (forward,
-- backward, optimizer, ...), from the first launch call's start to the last one's end; launch
-- calls that took $sync_ns or more (the host blocked in the runtime, e.g. a synchronizing copy
-- for loss.item()) as 'sync'; and the data-loader spans of the step's CPU span. Aligned.
WITH launches AS (
    SELECT rank, phase, launch_ts_ns, least(launch_end_ns, launch_ts_ns + $sync_ns) AS launch_end_ns,
           row_number() OVER (PARTITION BY rank ORDER BY launch_ts_ns)
         - row_number() OVER (PARTITION BY rank, phase ORDER BY launch_ts_ns) AS run
    FROM activities
    WHERE step = $step AND list_contains($ranks, rank) AND launch_ts_ns IS NOT NULL
),
runs AS (
    SELECT rank, phase, min(launch_ts_ns) AS start_ns, max(launch_end_ns) AS end_ns
    FROM launches GROUP BY rank, phase, run
),
blocked AS (
    SELECT rank, 'sync' AS phase, launch_ts_ns AS start_ns, launch_end_ns AS end_ns
    FROM activities
    WHERE step = $step AND list_contains($ranks, rank) AND launch_end_ns - launch_ts_ns >= $sync_ns
),
loader AS (
    SELECT c.rank, 'dataloader' AS phase, c.ts_ns AS start_ns, c.ts_ns + c.dur_ns AS end_ns
    FROM cpu_ops c JOIN steps s ON s.file_id = c.file_id AND s.step = $step
    WHERE c.name LIKE 'enumerate(DataLoader)%' AND list_contains($ranks, c.rank)
      AND c.ts_ns < s.cpu_end_ns AND c.ts_ns + c.dur_ns > s.cpu_start_ns
)
SELECT r.rank, r.phase, r.start_ns + coalesce(o.offset_ns, 0) AS start_ns, r.end_ns + coalesce(o.offset_ns, 0) AS end_ns
FROM (SELECT * FROM runs UNION ALL SELECT * FROM blocked UNION ALL SELECT * FROM loader) r
LEFT JOIN clock_offsets o USING (rank)
ORDER BY r.rank, r.start_ns;

-- name: under_cursor
-- GPU activities of one rank overlapping [$t0_ns, $t1_ns) on that rank's own clock, the longest
-- overlap first; `total` counts them all.
SELECT name, op_name, kclass, collective, phase, stream, ts_ns, end_ns, flops, count(*) OVER () AS total
FROM activities
WHERE rank = $rank AND ts_ns < $t1_ns AND end_ns > $t0_ns
ORDER BY least(end_ns, $t1_ns) - greatest(ts_ns, $t0_ns) DESC, ts_ns
LIMIT $limit;

-- name: collective_groups
-- Collectives by process group, collective and size (power-of-two buckets of msg_bytes; -1 when
-- unknown). exposed: the calls' time while the GPU ran communication only (gpu_segments 'comm').
-- last_rank: the rank that arrived last most often, with the number of instances it did.
WITH c AS (
    SELECT *, coalesce(CAST(floor(log2(nullif(msg_bytes, 0))) AS INTEGER), -1) AS size_log2 FROM collectives
),
exposed AS (
    SELECT c.rank, c.instance, sum(least(c.end_ns, g.end_ns) - greatest(c.ts_ns, g.start_ns)) AS exposed_ns
    FROM collectives c JOIN gpu_segments g
      ON g.rank = c.rank AND g.state = 'comm' AND g.start_ns < c.end_ns AND g.end_ns > c.ts_ns
    GROUP BY c.rank, c.instance
),
last_counts AS (
    SELECT pg_name, collective, size_log2, last_rank, count(DISTINCT instance) AS n
    FROM c WHERE last_rank IS NOT NULL GROUP BY ALL
),
last AS (
    SELECT pg_name, collective, size_log2, arg_max(last_rank, n) AS last_rank, max(n) AS last_n
    FROM last_counts GROUP BY ALL
)
SELECT c.pg_name, any_value(c.pg_desc) AS pg_desc, c.collective, c.size_log2,
       min(c.msg_bytes) AS min_bytes, max(c.msg_bytes) AS max_bytes,
       count(*) AS calls, count(DISTINCT c.instance) AS instances, count(DISTINCT c.rank) AS ranks,
       max(c.group_size) AS group_size, any_value(c.group_ranks) AS group_ranks,
       sum(c.end_ns - c.ts_ns) AS time_ns, sum(coalesce(e.exposed_ns, 0)) AS exposed_ns,
       sum(c.wait_ns) AS wait_ns, median(c.busbw_gbps) AS busbw_gbps,
       any_value(l.last_rank) AS last_rank, any_value(l.last_n) AS last_n
FROM c LEFT JOIN exposed e ON e.rank = c.rank AND e.instance = c.instance
LEFT JOIN last l ON l.pg_name IS NOT DISTINCT FROM c.pg_name AND l.collective IS NOT DISTINCT FROM c.collective
                AND l.size_log2 = c.size_log2
GROUP BY c.pg_name, c.collective, c.size_log2
ORDER BY exposed_ns DESC, time_ns DESC, c.pg_name, c.collective, c.size_log2
LIMIT $limit;

-- name: collective_instances
-- The instances of one group row, the longest wait first: who was last, and how long the others waited.
-- The step is the one whose GPU window holds the call's start on its rank.
SELECT c.instance, min(s.step) AS step, count(*) AS ranks, max(c.msg_bytes) AS msg_bytes,
       max(c.end_ns - c.ts_ns) AS max_dur_ns, max(c.wait_ns) AS max_wait_ns, sum(c.wait_ns) AS wait_ns,
       any_value(c.last_rank) AS last_rank, median(c.busbw_gbps) AS busbw_gbps,
       min(c.aligned_ts_ns) AS aligned_ts_ns, max(c.aligned_end_ns) AS aligned_end_ns
FROM collectives c LEFT JOIN steps s ON s.rank = c.rank AND c.ts_ns >= s.start_ns AND c.ts_ns < s.end_ns
WHERE c.pg_name IS NOT DISTINCT FROM $pg_name AND c.collective IS NOT DISTINCT FROM $collective
  AND coalesce(CAST(floor(log2(nullif(c.msg_bytes, 0))) AS INTEGER), -1) = $size_log2
GROUP BY c.instance
ORDER BY max_wait_ns DESC, aligned_ts_ns, c.instance
LIMIT $limit;

-- name: capture_windows
-- Which ranks reported in which capture window (live mode), and the world size they declare.
SELECT capture_window, rank, world_size FROM trace_files
WHERE kind = 'kineto' AND rank IS NOT NULL
ORDER BY capture_window, rank;

-- name: gpus_per_node
-- deviceProperties lists every GPU of the host: its length is the GPUs per node.
SELECT max(json_array_length(device_props)) FROM trace_files WHERE kind = 'kineto';
