-- What a finding's evidence ids point at (diag/outputs/evidence.py): the TUI jumps to it, the HTML
-- page names it. Each block starts with `-- name: <query>` and takes DuckDB named parameters.
-- `aligned` times add clock_offsets.offset_ns to put every rank on the reference rank's clock.

-- name: instance_by_id
-- One collective instance (evidence `coll:<instance>`): its group row's key and where it ran.
SELECT c.pg_name, any_value(c.pg_desc) AS pg_desc, c.collective,
       coalesce(CAST(floor(log2(nullif(max(c.msg_bytes), 0))) AS INTEGER), -1) AS size_log2,
       min(s.step) AS step, any_value(c.last_rank) AS last_rank, max(c.wait_ns) AS max_wait_ns,
       min(c.aligned_ts_ns) AS aligned_ts_ns, max(c.aligned_end_ns) AS aligned_end_ns, max(c.msg_bytes) AS msg_bytes
FROM collectives c LEFT JOIN steps s ON s.rank = c.rank AND c.ts_ns >= s.start_ns AND c.ts_ns < s.end_ns
WHERE c.instance = $instance
GROUP BY c.pg_name, c.collective;

-- name: activity_by_index
-- One activity (evidence `act:<file_id>:<index>`): `idx` is its position in the file's timeline.
SELECT a.rank, a.step, a.name, a.kclass, a.op_name, a.ts_ns + coalesce(o.offset_ns, 0) AS aligned_ts_ns,
       a.end_ns + coalesce(o.offset_ns, 0) AS aligned_end_ns, a.flops
FROM activities a LEFT JOIN clock_offsets o USING (rank)
WHERE a.file_id = $file_id
  AND a.idx = $index;

-- name: step_time
-- One rank's step (evidence `step:<rank>:<step>`).
SELECT window_ns FROM gpu_states WHERE rank = $rank AND step = $step;
