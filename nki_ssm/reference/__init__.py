"""float64 NumPy references: the executable specification of every op.

numpy (and ml_dtypes for bf16 inputs) only. See docs/contracts.md,
"References", for the signatures.
"""
