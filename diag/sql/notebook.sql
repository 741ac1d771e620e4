-- The tables a notebook gets from `diag.open(...)` (diag/notebook.py), over the analysis tables
-- (rank_tables.sql, analysis.sql). Each block starts with `-- name: <method>`; each returns one
-- DataFrame. Times are ns on the rank's own clock unless a column says `aligned`.

-- name: ledger
-- The attribution ledger, rank × step × bucket: seconds of the step's window each bucket claims
-- and that as a fraction of the window (docs/ledger.md). Only the steps the means keep.
SELECT rank, step, bucket, seconds, fraction
FROM ledger
ORDER BY rank, step, bucket;

-- name: steps
-- One row per rank and step: the GPU window and its four states (compute, comm, copy, idle add up
-- to window_ns), with model FLOPs where known. `in_means` is false for a warm-up or teardown step
-- the report leaves out (steps_excluded) and for a step outside the ledger.
SELECT s.rank, s.capture_window, s.step, s.start_ns, s.end_ns,
       g.window_ns, g.compute_ns, g.comm_ns, g.copy_ns, g.idle_ns, g.matmul_ns, g.wait_ns,
       g.dataloader_ns, g.host_bound_ns, g.model_flops, s.n_kernels,
       EXISTS (SELECT 1 FROM ledger l WHERE l.rank = s.rank AND l.step = s.step) AS in_means
FROM steps s
LEFT JOIN gpu_states g ON g.file_id = s.file_id AND g.step = s.step
ORDER BY s.rank, s.capture_window, s.step;

-- name: kernels
-- GPU activities (kernels, copies, memsets) by name over all ranks, the most time first:
-- achieved TFLOP/s = FLOPs from op shapes ÷ the time of the calls that have them.
SELECT name, any_value(kclass) AS kclass, count(*) AS calls, sum(end_ns - ts_ns) * 1e-9 AS seconds,
       sum(end_ns - ts_ns) / (SELECT sum(end_ns - ts_ns) FROM activities) AS share,
       sum(flops) FILTER (WHERE flops > 0)
           / nullif(sum(end_ns - ts_ns) FILTER (WHERE flops > 0), 0) * 1e-3 AS tflops_achieved
FROM activities
GROUP BY name
ORDER BY seconds DESC, name;

-- name: collectives
-- One row per collective call per rank, matched across ranks by `instance`: the wait for the last
-- rank (wait_ns) and the transfer after it, with bus bandwidth.
SELECT rank, step, pg_name, pg_desc, collective, instance, group_size, msg_bytes, dtype,
       ts_ns, end_ns, aligned_ts_ns, aligned_end_ns, wait_ns, transfer_ns, last_rank, n_matched,
       algbw_gbps, busbw_gbps
FROM collectives
ORDER BY rank, ts_ns;

-- name: critical_path
-- Each step's cross-rank critical path (docs/critical_path.md), segments in time order, aligned.
SELECT step, seq, rank, kind, start_ns, end_ns, end_ns - start_ns AS dur_ns, what
FROM critical_path
ORDER BY step, seq;
