-- `diag export --perfetto` (diag/outputs/perfetto.py): the source events of one rank as Chrome trace-event
-- JSON objects, one per row, on the aligned clock. docs/export.md gives the track layout.

-- Every thread of the export: per rank, the GPU streams (device, stream) and the CPU threads
-- (pid, tid) of its files, numbered from 10 (1..9 are diag's own tracks), GPU streams first.
-- A flow event on a (pid, tid) that is no GPU stream of its rank is on a CPU thread.
CREATE OR REPLACE TEMP TABLE _export_threads AS
WITH gpu AS (
    SELECT DISTINCT rank, device::BIGINT AS a, stream AS b FROM (
        SELECT rank, device, stream FROM kernels UNION ALL
        SELECT rank, device, stream FROM copies UNION ALL
        SELECT rank, device, stream FROM gpu_annotations)
), cpu AS (
    SELECT DISTINCT rank, pid AS a, tid AS b FROM (
        SELECT rank, pid, tid FROM cpu_ops UNION ALL
        SELECT rank, pid, tid FROM runtime_calls UNION ALL
        SELECT f.rank, f.pid, f.tid FROM flows f
        WHERE NOT EXISTS (SELECT 1 FROM gpu g WHERE g.rank = f.rank AND g.a = f.pid AND g.b = f.tid))
), both_sides AS (
    SELECT rank, true AS gpu, a, b FROM gpu UNION ALL SELECT rank, false, a, b FROM cpu
)
SELECT rank, gpu, a, b,
       9 + row_number() OVER (PARTITION BY rank ORDER BY gpu DESC, a NULLS FIRST, b NULLS FIRST) AS out_tid
FROM both_sides;

-- The events of rank `r` whose span meets [lo, hi) on its own clock, shifted by `off` (its clock
-- offset) and made relative to `origin` (ns), in µs. Other spans (Kineto's 'Trace' span), counters and
-- instants go on track 4.
CREATE OR REPLACE TEMP MACRO export_events(r, off, origin, lo, hi) AS TABLE
WITH ev AS (
    SELECT cat, name, false AS gpu, pid AS a, tid AS b, ts_ns, dur_ns, args FROM cpu_ops WHERE rank = r
    UNION ALL SELECT cat, name, false, pid, tid, ts_ns, dur_ns, args FROM runtime_calls WHERE rank = r
    UNION ALL SELECT 'kernel', name, true, device, stream, ts_ns, dur_ns, args FROM kernels WHERE rank = r
    UNION ALL SELECT 'gpu_' || kind, name, true, device, stream, ts_ns, dur_ns, args FROM copies WHERE rank = r
    UNION ALL SELECT 'gpu_user_annotation', name, true, device, stream, ts_ns, dur_ns, args FROM gpu_annotations
        WHERE rank = r
)
SELECT json_object('ph', 'X', 'cat', ev.cat, 'name', ev.name, 'pid', r, 'tid', t.out_tid,
                   'ts', (ev.ts_ns + off - origin) / 1000.0, 'dur', ev.dur_ns / 1000.0,
                   'args', coalesce(ev.args, '{}'::JSON))::VARCHAR AS e
FROM ev JOIN _export_threads t
  ON t.rank = r AND t.gpu = ev.gpu AND t.a IS NOT DISTINCT FROM ev.a AND t.b IS NOT DISTINCT FROM ev.b
WHERE ev.ts_ns < hi AND ev.ts_ns + ev.dur_ns >= lo
UNION ALL
-- Flow events (launch arrows, forward/backward links): ids made unique per file, as integers.
SELECT (CASE WHEN f.ph = 'f'
        THEN json_object('ph', 'f', 'bp', 'e', 'cat', f.cat, 'name', f.name, 'pid', r, 'tid', t.out_tid,
                         'ts', (f.ts_ns + off - origin) / 1000.0, 'id', f.n)
        ELSE json_object('ph', f.ph, 'cat', f.cat, 'name', f.name, 'pid', r, 'tid', t.out_tid,
                         'ts', (f.ts_ns + off - origin) / 1000.0, 'id', f.n) END)::VARCHAR
FROM (SELECT *, file_id * 4294967296 + dense_rank() OVER (PARTITION BY file_id ORDER BY cat, flow_id) AS n
      FROM flows WHERE rank = r) f
JOIN _export_threads t ON t.rank = r AND t.a IS NOT DISTINCT FROM f.pid AND t.b IS NOT DISTINCT FROM f.tid
  AND t.gpu = EXISTS (SELECT 1 FROM _export_threads g WHERE g.rank = r AND g.gpu AND g.a = f.pid AND g.b = f.tid)
WHERE f.ts_ns < hi AND f.ts_ns >= lo
UNION ALL
SELECT (CASE WHEN o.ph = 'X'
        THEN json_object('ph', 'X', 'cat', o.cat, 'name', o.name, 'pid', r, 'tid', 4,
                         'ts', (o.ts_ns + off - origin) / 1000.0, 'dur', coalesce(o.dur_ns, 0) / 1000.0,
                         'args', coalesce(o.args, '{}'::JSON))
        ELSE json_object('ph', o.ph, 'cat', o.cat, 'name', o.name, 'pid', r, 'tid', 4,
                         'ts', (o.ts_ns + off - origin) / 1000.0, 'args', coalesce(o.args, '{}'::JSON)) END)::VARCHAR
FROM other_events o
WHERE o.rank = r AND o.ph IN ('X', 'C', 'i', 'I') AND o.ts_ns IS NOT NULL
  AND o.ts_ns < hi AND o.ts_ns + coalesce(o.dur_ns, 0) >= lo;
