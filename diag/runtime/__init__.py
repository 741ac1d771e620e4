"""The plumbing every stage runs on: the DuckDB store and its schema (diag/sql/schema.sql), the
executors (local processes, Ray), the run's scratch directory and helper lifetimes, errors and
exit codes, progress bars, process settings (garbage collector, BLAS threads, Arrow's allocator,
pandas kept out), option types, and how durations and shares read.

Imports nothing of diag's above it: the bottom layer, beside diag.knowledge.
"""
