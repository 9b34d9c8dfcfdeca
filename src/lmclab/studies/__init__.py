"""Studies over finished runs, above the analyses: each reads the tables of one or more runs and writes
tables and Markdown (the paper's findings checked on a run, the three-model, width, sweep, mixup and
transformer studies)."""
