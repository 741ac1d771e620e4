"""Runs an analysis over a store: the map over ranks (map_step; locally, in a pool, or on an
executor through rank_map), the reduce (matching collectives, clocks, waits), the ledger claims
and the rules' findings (run.analyze → Analysis).

The one package of diag/ that imports rules/; outputs and the API stand above it.
"""
