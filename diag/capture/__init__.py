"""The stage before ingest: capturing Kineto traces diag reads with no flags (profiler: the
`capture` context and `diag capture -- CMD`) and the example job that injects each cause for real
(example/). torch is imported only inside the functions that need it.

Imports diag.runtime only.
"""
