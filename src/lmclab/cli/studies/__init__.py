"""``lmclab study NAME``: the studies over finished runs of the pipeline (:mod:`lmclab.studies`), each a page,
a figure and Parquet tables built from runs or ``dvc exp`` experiments, run by hand — not DVC stages.

    lmclab study lm collect --run ../run-lm …          # language models (docs "Language models")
    lmclab study many collect --run ../run-many        # every n-model method at full length
    lmclab study three queue | collect                 # three models (Table 3, Figure 5)
    lmclab study transformer collect --run NAME=DIR …  # supervised and MAE-pretrained ViTs
    lmclab study width | sweep | mixup …               # a dvc exp sweep (Appendix H.4, H.5)
"""

from __future__ import annotations

import typer

from lmclab.cli.studies import lm, many, sweeps, three, transformer

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="The studies over finished runs of the pipeline, by hand."
)
STUDIES = {  # name -> (its typer app or command, one line for `lmclab study --help`)
    "lm": (lm.app, "language models: a GPT's barriers per method, with width and training length (reports/lm)"),
    "many": (many.app, "every n-model method on one run's models at full length (reports/many_models)"),
    "three": (three.app, "three models, Table 3 and Figure 5: queue the dvc exps, collect (reports/three_study)"),
    "transformer": (transformer.app, "supervised and MAE-pretrained ViTs, every method (reports/transformers)"),
    "width": (sweeps.width, "a dvc exp sweep over the width, Appendix H.4 (reports/width)"),
    "sweep": (sweeps.sweep, "a dvc exp sweep over one parameter, Appendix H.5 (e.g. reports/sweeps/lr)"),
    "mixup": (sweeps.mixup, "endpoints trained with and without mixup (reports/mixup)"),
}
for name, (study, line) in STUDIES.items():
    if isinstance(study, typer.Typer):
        app.add_typer(study, name=name, short_help=line)
    else:
        app.command(name, short_help=line)(study)
