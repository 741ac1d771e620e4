"""What diag knows about the world, as data: GPU parts and their peaks (data/parts.toml), kernel
families (data/kernels.toml), GEMM ceilings (data/gemm_ceiling.csv), link bandwidths, model FLOPs
per token and the MFU arithmetic of `diag mfu`.

Owns no trace and no store. Imports only diag.runtime (errors, option types) and the standard
library, so every stage above may consult it.
"""
