"""Where each rank-step's time goes: the per-rank digest the map step keeps (digest), the
twelve-bucket ledger (ledger), the dtype mix and GEMM shapes, the critical path, what-if retiming,
the analysis tables written to the store, and the interface the rules implement (analysis:
RankContext, StepContext, RunContext, Finding).

Imports diag.timeline and below. rules/ builds on this package; diag.engine, which runs the
rules, stands above both.
"""
