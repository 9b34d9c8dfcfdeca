"""lmclab: linear mode connectivity and permutation-based model merging (see README, SPEC.md)."""

__version__ = "0.1.0"
