"""Process plumbing for the pipeline: warm-started stage processes, whom they trust, and their
lifetime. Reached from :mod:`lmclab.pipeline` only."""
