"""Decode and store: trace files found by content (discover, sniff), read within their caps
(source, read_ahead), parsed into Arrow tables shaped like diag/sql/schema.sql (the Kineto parse:
kineto, kineto_decode, kineto_tabulate, kineto_split with its forked half; merged ranks; the three
NCCL-side formats behind nccl), their ranks assigned, and written into the store one file at a
time (pipeline, parse_file, options).

Imports diag.knowledge and diag.runtime only. The command layer starts a big file's read and
parse early through diag.ingest.early, and knows nothing else of how it is done.
"""
