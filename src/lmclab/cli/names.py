"""One name per concept, from params.yaml to the API and the command line: the registry of every keyword of the
public API and every option of the ``lmclab`` command, each tied to its concept and, where the pipeline has
one, its params.yaml key. A concept keeps one name everywhere (``--repair-samples`` is the flag of the keyword
``repair_samples`` and of the key ``measure.repair_samples``); where the names differ, ``reason`` says why.
``tools/names_table.py`` writes the table of docs/api.md from it, and tests/cli/test_names.py fails when a
keyword or an option is not registered (the options of ``lmclab study``'s commands are each study's own: they
read finished runs, not models), when a registered name is not where the registry says, or when two
names of one concept differ without a reason.
"""

from __future__ import annotations

from typing import NamedTuple


class Concept(NamedTuple):
    """One concept: its params.yaml keys, its API keyword, its command option (``--flag`` or ``ARGUMENT``)."""

    keys: tuple[str, ...] = ()
    keyword: str | None = None
    flag: str | None = None
    reason: str = ""  # why a name differs from the others (empty: they are the same name)
    meaning: str = ""
    also: tuple[str, ...] = ()  # the option's spelling as a command's argument


CONCEPTS: dict[str, Concept] = {
    "method": Concept(
        ("permute.methods", "merge_many.methods"),
        "method",
        "--method",
        "params.yaml lists the methods of a run; a call and a command run one",
        "the search (pair) or merge (n-model) method",
    ),
    "options": Concept(
        ("permute.<method>", "merge_many.<method>"),
        "options",
        "--option",
        "params.yaml has one block per method; the flag is repeated, one key=value each",
        "the method's own options",
    ),
    "seed": Concept(("permute.seed",), "seed", "--seed", "", "seeds the randomness of the searches"),
    "symmetry": Concept(
        (), "symmetry", "--symmetry", "", "permutation, or orthogonal maps of the groups the tracer proves"
    ),
    "device": Concept(("device",), "device", "--device", "", "auto (a GPU when present), cpu or cuda[:N]"),
    "threads": Concept(("threads",), None, "--threads", "", "intra-op threads of the process"),
    "num_lambdas": Concept(("measure.num_lambdas",), "num_lambdas", "--num-lambdas", "", "evenly spaced λ in [0, 1]"),
    "lambdas": Concept((), "lambdas", None, "", "the λ values of a curve themselves (holding 0, ½ and 1)"),
    "repair": Concept(
        ("measure.repair", "merge_many.repair"), "repair", "--repair", "", "none, bn, repair (REPAIR) or auto"
    ),
    "repair_samples": Concept(
        ("measure.repair_samples", "merge_many.repair_samples"),
        "repair_samples",
        "--repair-samples",
        "",
        "training samples of the repair's statistics",
    ),
    "repair_data": Concept(
        (), "repair_data", None, "", "the data a curve's repair reads (the command: --data's train)"
    ),
    "train_samples": Concept(("measure.train_samples",), None, None, "", "the train curves' subset"),
    "partial": Concept(("model.traced.partial",), "partial", "--partial", "", "leave unproven channels unpermuted"),
    "factory": Concept(
        ("model.traced.factory",),
        "factory",
        "--factory",
        "",
        "module:callable building the module (lmclab trace: its argument FACTORY)",
        ("FACTORY",),
    ),
    "kwargs": Concept(("model.traced.kwargs",), "kwargs", "--kwargs", "", "keyword arguments of the factory"),
    "in_channels": Concept(("model.traced.in_channels",), None, "--in-channels", "", "channels the network expects"),
    "data": Concept(
        ("data.name",),
        "data",
        "--data",
        "params.yaml and the command name a data set (or a prepared folder); a call passes the data itself",
        "training data (the methods that read activations, the repairs)",
    ),
    "data_root": Concept(("data.root",), None, "--data-root", "", "torchvision's download and cache folder"),
    "eval_data": Concept(
        (),
        "eval_data",
        "--split",
        "the command evaluates one split of --data",
        "the data a curve (or a search's learning curve) is evaluated on",
    ),
    "models": Concept(
        ("merge_many.seeds",),
        "models",
        "MODELS",
        "the pipeline names the trained seeds it merges; a call and the command take the models",
        "the N models merged",
    ),
    "model_a": Concept((), "model_a", "MODEL_A", "", "θa"),
    "model_b": Concept((), "model_b", "MODEL_B", "", "θb, aligned to θa"),
    "alignment": Concept((), "alignment", "--alignment", "", "the permutation found for θb, with its spec"),
    "lam": Concept((), "lam", "--lam", "", "λ of λ·θa + (1−λ)·π(θb)"),
    "progress": Concept((), "progress", "--progress", "", "progress bars on stderr"),
    "example_inputs": Concept(
        (),
        "example_inputs",
        "--input-shape",
        "the command traces on zeros of a shape; a call passes inputs",
        "inputs to trace the spec on",
    ),
    "out": Concept((), "out", "--out", "", "the file or folder written (the merged folder of merge_folders)"),
    "stream": Concept(
        (), "stream", "--stream", "", "two Hugging Face folders read one tensor at a time (by size when unset)"
    ),
    "max_shard_bytes": Concept((), "max_shard_bytes", None, "", "a merged folder's largest shard (256 MiB)"),
    "json": Concept((), None, "--json", "", "the barriers also as JSON (accuracies as fractions)"),
    "params": Concept(
        (), None, "--params", "", "a pipeline's params.yaml (lmclab validate: its argument)", ("PARAMS",)
    ),
    "preset": Concept((), None, "NAME", "", "lmclab preset's argument: a preset of presets/ (the paper's settings)"),
    "presets": Concept((), None, "--presets", "", "the folder of presets"),
    "set_params": Concept((), None, "--set-params", "", "print `dvc exp run -S` flags instead of rewriting"),
    "list": Concept((), None, "--list", "", "list the presets"),
    "spec": Concept((), "spec", None, "", "the permutation spec (default: traced, or an lmclab checkpoint's)"),
    "model": Concept((), "model", None, "", "the nn.Module of state dicts (the command: --factory)"),
    "points": Concept((), "points", None, "", "activation points of AM (default: traced)"),
    "loss_fn": Concept((), "loss_fn", None, "", "a loss replacing the cross-entropy of the logits"),
    "weights": Concept((), "weights", None, "", "the endpoints' weights of a repair's targets"),
    "merged_params": Concept((), "merged_params", None, "", "the merged model a repair fixes"),
    "endpoints": Concept((), "endpoints", None, "", "the models a repair's targets come from"),
    "arch": Concept(("model.arch",), "arch", None, "", "a registered architecture"),
    "config": Concept(
        ("model.<arch>",),
        "config",
        None,
        "params.yaml has one block per architecture, named after it",
        "the architecture's options (create_model(**config))",
    ),
}

# the functions of the public API whose keywords are registered (each keyword is a concept above)
FUNCTIONS = (
    "align",
    "find_permutation",
    "curve",
    "merge",
    "merge_folders",
    "l2_reduction",
    "merge_many",
    "repair",
    "create_model",
)


def keyword_concepts() -> dict[str, str]:
    """API keyword → concept."""
    return {c.keyword: name for name, c in CONCEPTS.items() if c.keyword}


def flag_of(keyword: str) -> str:
    """The command's option for the API keyword ``keyword`` (``num_lambdas`` → ``--num-lambdas``), for the
    library's errors the command reports; the keyword itself where the command has no option for it."""
    concept = CONCEPTS.get(keyword_concepts().get(keyword, ""))
    return concept.flag if concept is not None and concept.flag else keyword


def flag_concepts() -> dict[str, str]:
    """Command option (``--flag`` or ``ARGUMENT``) → concept."""
    return {flag: name for name, c in CONCEPTS.items() for flag in ([c.flag] if c.flag else []) + list(c.also)}


def same_name(concept: Concept) -> bool:
    """Do the concept's params.yaml keys, keyword and flag share one name? A key may be named by its last part
    or by its whole path (``data.root`` ~ ``--data-root``); a flag ``--b-c`` is ``b_c``."""
    names = [{k.rsplit(".", 1)[-1], k.replace(".", "_")} for k in concept.keys]
    names += [{concept.keyword}] if concept.keyword else []
    flags = [concept.flag] if concept.flag else []
    names += [{f.lstrip("-").replace("-", "_").lower()} for f in (*flags, *concept.also)]
    return not names or bool(set.intersection(*names))


def rows() -> list[tuple[str, str, str, str, str]]:
    """``(concept, params.yaml keys, API keyword, flag, reason)`` for the docs' table, by concept."""
    out = []
    for name, c in CONCEPTS.items():
        keys = ", ".join(f"`{k}`" for k in c.keys) or "—"
        out.append((name, keys, f"`{c.keyword}`" if c.keyword else "—", f"`{c.flag}`" if c.flag else "—", c.reason))
    return out
