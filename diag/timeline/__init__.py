"""Per-rank timelines: each rank's events read back from the store as arrays (rank.py), the GPU
state sweep (sweep, states), nesting of CPU ops and frames, collectives and their matching across
ranks, clock alignment, phases, steps and their outliers, and the pipeline layout.

What flows out: RankTimeline, StepStates and matched collectives. Imports diag.ingest (the stored
columns' meaning), diag.knowledge and diag.runtime; never the attribution, the rules or outputs.
"""
