"""The core of lmclab: the :class:`~lmclab.core.spec.PermutationSpec` contract and what every method
and analysis shares — merging, distances, evaluation, BatchNorm repair, interpolation curves and
barriers, data splits, devices, atomic writes, data-parallel evaluation and typed keyword options.
Imports nothing above it."""
