"""The DVC pipeline's layer: the typed schema of params.yaml, its validation, and the plumbing the
stage scripts share (reading params as DVC does, one-line errors, warm start, torchrun relaunch)."""
