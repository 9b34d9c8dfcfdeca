"""What ``lmclab.trace.trace_spec`` supports across timm, torchvision and transformers, measured.

For each model of :data:`MODELS` (random weights, ``num_classes=10`` or a small config, float64, eval
mode): traced or refused (the refusal's reason), the number of groups (headed ones), the largest
change of the outputs under a random permutation of every group of the traced spec relative to their
largest magnitude (float64 rounding only if the spec is right), and whether weight matching
(``lmclab.find_permutation(a, b, method="wm")``, default options) brings a permuted copy θb = π(θa)
back to θa exactly, with the seconds of the trace and of WM. Then the kinds of its canonical copy
(``lmclab.canonicalize``, traced with ``symmetry="orthogonal"``): the groups an orthogonal (or centred) map
may act on, the outputs' largest change under a random element of each (float64 rounding only if the proof is
right), and otherwise why the widest group stays a permutation group.

    python tools/trace_coverage.py [--models timm:resnet18,torchvision:vgg11_bn] [--out reports/coverage.json]
    python tools/trace_coverage.py --docs   # the coverage table of docs/architectures.md, from that JSON

The full run (every model into ``reports/coverage.json``, then the table) is one command, about 15 minutes
on two shared cores; ``--models`` with another ``--out`` measures a few without touching the table.

The JSON records the command, commit, machine and library versions. Run with ``OMP_NUM_THREADS=1`` on a
shared machine (two busy threads per core slow torch's CPU kernels by orders of magnitude).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

import torch
from torch import nn

from lmclab import canonicalize, find_permutation
from lmclab.core.spec import PermutationSpec, apply_permutation, random_permutation
from lmclab.trace import TraceError, trace_spec
from lmclab.trace.pinned import pinned_share

ROOT = Path(__file__).resolve().parent.parent
OUT, DOCS = ROOT / "reports" / "coverage.json", ROOT / "docs" / "architectures.md"
START = "<!-- coverage table: generated from reports/coverage.json by tools/trace_coverage.py --docs -->"
END = "<!-- end of coverage table -->"
IMAGE = (3, 32, 32)
SWIN_IMAGE = (3, 56, 56)  # timm's Swin: 14 × 14 tokens of 4 × 4 pixels, windows of 7
TEXT = (8,)  # token ids of a sequence of 8


def timm_model(name: str, **kwargs: object) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import timm

        return timm.create_model(name, pretrained=False, num_classes=10, **kwargs)

    return build


def torchvision_model(name: str, **kwargs: object) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import torchvision

        return getattr(torchvision.models, name)(weights=None, num_classes=10, **kwargs)

    return build


def transformers_model(model: str, config: str, small: bool = True, **kwargs: object) -> Callable[[], nn.Module]:
    """``model(config(**kwargs))``, with two layers of 4 heads and a vocabulary of 100 unless not ``small``
    (a vision config whose depths and heads are per stage)."""

    def build() -> nn.Module:
        import transformers

        sizes = {"num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 100}
        return getattr(transformers, model)(getattr(transformers, config)(**(sizes if small else {}) | kwargs))

    return build


GPT2 = {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 32, "vocab_size": 100}
GPT2 |= {"bos_token_id": 0, "eos_token_id": 0}  # within the small vocabulary
GQA = {"hidden_size": 32, "num_key_value_heads": 2}  # 4 query heads read 2 key/value heads
OPT = {"hidden_size": 32, "ffn_dim": 64, "word_embed_proj_dim": 32, "max_position_embeddings": 32}
T5 = {"d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4, "decoder_start_token_id": 0}
HF_SWIN = {"image_size": 32, "patch_size": 4, "embed_dim": 16, "depths": [1, 1], "num_heads": [2, 2], "window_size": 4}
CONVNEXT = {"hidden_sizes": [16, 32], "depths": [1, 1], "num_stages": 2, "image_size": 32, "num_labels": 10}
SEQ2SEQ = (8, 8)  # token ids of a sequence of 8 and of its decoder's sequence of 8 (a dict of both)
# name -> (builder, input shape without the batch axis; a 1-axis shape is token ids)
MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "timm:vit_tiny_patch16_224": (timm_model("vit_tiny_patch16_224", img_size=32), IMAGE),
    "timm:deit_tiny_patch16_224": (timm_model("deit_tiny_patch16_224", img_size=32), IMAGE),
    "timm:resnet18": (timm_model("resnet18"), IMAGE),
    "timm:convnext_atto": (timm_model("convnext_atto"), IMAGE),
    "timm:mixer_s16_224": (timm_model("mixer_s16_224", img_size=32), IMAGE),
    "timm:mobilenetv3_small_100": (timm_model("mobilenetv3_small_100"), IMAGE),
    "timm:efficientnet_b0": (timm_model("efficientnet_b0"), IMAGE),
    "timm:swin_tiny_patch4_window7_224": (timm_model("swin_tiny_patch4_window7_224", img_size=56), SWIN_IMAGE),
    "torchvision:resnet18": (torchvision_model("resnet18"), IMAGE),
    "torchvision:vgg11_bn": (torchvision_model("vgg11_bn"), IMAGE),
    "torchvision:mobilenet_v3_small": (torchvision_model("mobilenet_v3_small"), IMAGE),
    "torchvision:convnext_tiny": (torchvision_model("convnext_tiny"), IMAGE),
    "torchvision:efficientnet_b0": (torchvision_model("efficientnet_b0"), IMAGE),
    "torchvision:regnet_y_400mf": (torchvision_model("regnet_y_400mf"), IMAGE),
    "torchvision:densenet121": (torchvision_model("densenet121"), IMAGE),
    "torchvision:vit_b_16": (torchvision_model("vit_b_16", image_size=32), IMAGE),
    "torchvision:shufflenet_v2_x0_5": (torchvision_model("shufflenet_v2_x0_5"), IMAGE),
    "torchvision:swin_t": (torchvision_model("swin_t"), IMAGE),
    "transformers:GPT2LMHeadModel": (transformers_model("GPT2LMHeadModel", "GPT2Config", **GPT2), TEXT),
    "transformers:BertForMaskedLM": (transformers_model("BertForMaskedLM", "BertConfig", hidden_size=32), TEXT),
    "transformers:ViTForImageClassification": (
        transformers_model(
            "ViTForImageClassification", "ViTConfig", hidden_size=32, image_size=32, patch_size=16, num_labels=10
        ),
        IMAGE,
    ),
    "transformers:LlamaForCausalLM": (transformers_model("LlamaForCausalLM", "LlamaConfig", **GQA), TEXT),
    "transformers:MistralForCausalLM": (transformers_model("MistralForCausalLM", "MistralConfig", **GQA), TEXT),
    "transformers:Qwen2ForCausalLM": (transformers_model("Qwen2ForCausalLM", "Qwen2Config", **GQA), TEXT),
    "transformers:GemmaForCausalLM": (transformers_model("GemmaForCausalLM", "GemmaConfig", **GQA, head_dim=8), TEXT),
    "transformers:PhiForCausalLM": (transformers_model("PhiForCausalLM", "PhiConfig", hidden_size=32), TEXT),
    "transformers:OPTForCausalLM": (transformers_model("OPTForCausalLM", "OPTConfig", **OPT), TEXT),
    "transformers:DistilBertForMaskedLM": (
        transformers_model("DistilBertForMaskedLM", "DistilBertConfig", hidden_size=32, hidden_dim=64),
        TEXT,
    ),
    "transformers:RobertaForMaskedLM": (
        transformers_model("RobertaForMaskedLM", "RobertaConfig", hidden_size=32),
        TEXT,
    ),
    "transformers:CLIPVisionModel": (
        transformers_model("CLIPVisionModel", "CLIPVisionConfig", hidden_size=32, image_size=32, patch_size=16),
        IMAGE,
    ),
    "transformers:ConvNextForImageClassification": (
        transformers_model("ConvNextForImageClassification", "ConvNextConfig", small=False, **CONVNEXT),
        IMAGE,
    ),
    "timm:regnety_002": (timm_model("regnety_002"), IMAGE),
    "transformers:GPTNeoXForCausalLM": (
        transformers_model("GPTNeoXForCausalLM", "GPTNeoXConfig", hidden_size=32),
        TEXT,
    ),
    "transformers:BloomForCausalLM": (
        transformers_model("BloomForCausalLM", "BloomConfig", hidden_size=32, n_layer=2, n_head=4),
        TEXT,
    ),
    "transformers:T5ForConditionalGeneration": (
        transformers_model("T5ForConditionalGeneration", "T5Config", **T5),
        SEQ2SEQ,
    ),
    "transformers:SwinForImageClassification": (
        transformers_model("SwinForImageClassification", "SwinConfig", small=False, **HF_SWIN, num_labels=10),
        IMAGE,
    ),
    "timm:levit_128s": (timm_model("levit_128s", img_size=32), IMAGE),
}


def inputs(shape: tuple[int, ...], batch: int, seed: int) -> torch.Tensor | dict[str, torch.Tensor]:
    """Images, token ids (a 1-axis shape), or an encoder's and a decoder's token ids (:data:`SEQ2SEQ`)."""
    gen = torch.Generator().manual_seed(seed)
    if shape == SEQ2SEQ:
        ids = [torch.randint(0, 100, (batch, n), generator=gen) for n in shape]
        return {"input_ids": ids[0], "decoder_input_ids": ids[1]}
    if len(shape) == 1:
        return torch.randint(0, 100, (batch, *shape), generator=gen)
    return torch.randn(batch, *shape, generator=gen, dtype=torch.float64)


def randomised(model: nn.Module, shape: tuple[int, ...]) -> nn.Module:
    """``model`` in float64 and eval mode with outputs that depend on the input: He-normal weights, BatchNorm
    statistics of a random batch, random norm affine terms, layer scales and position-bias tables near 1."""
    torch.manual_seed(0)
    model = model.double()
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight)
        for m in norms:
            m.reset_running_stats()
            m.momentum = None  # a plain average over the calibration batch
        if norms:
            model.train()(inputs(shape, 4, seed=0))  # images only: no transformers model has BatchNorm
        for m in model.modules():
            if isinstance(m, (*[type(n) for n in norms], nn.LayerNorm, nn.GroupNorm)) and m.weight is not None:
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.1)
        for name, p in model.named_parameters():
            if name.endswith(("gamma", "layer_scale", "bias_table", "layer_scale_parameter")):
                p.uniform_(0.5, 1.5)
    return model.eval()


def logits(model: nn.Module, x: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
    """The output tensor (a transformers model's ``logits``, or its first output: CLIP's last hidden state)."""
    with torch.no_grad():
        out = model(**x) if isinstance(x, dict) else model(x)
    return out if isinstance(out, torch.Tensor) else out.get("logits", out[0])


def permuted(model: nn.Module, spec: PermutationSpec, seed: int) -> nn.Module:
    """θb = π(θa): a copy of ``model`` with every group of ``spec`` randomly permuted."""
    state = model.state_dict()
    perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(seed), spec.heads)
    twin = copy.deepcopy(model)
    twin.load_state_dict(apply_permutation(spec, perm, state))
    return twin


def recovered(model: nn.Module, twin: nn.Module, spec: PermutationSpec, x: torch.Tensor) -> bool:
    """WM (default options) on ``model`` and its permuted ``twin``: π(θb) equal to θa on every matched entry."""
    given = {"spec": spec} if isinstance(x, dict) else {"example_inputs": x}  # a dict of inputs: the spec traced
    found = find_permutation(model, twin, method="wm", **given)
    back, params_a = found.apply(twin), spec.matched(model.state_dict())
    return all(torch.equal(back[k], v) for k, v in params_a.items())


def measure(name: str) -> dict:
    """One row: traced or refused, groups, invariance, WM's planted recovery, seconds."""
    build, shape = MODELS[name]
    size = f"token ids × {shape[0]}" if len(shape) == 1 else "×".join(map(str, shape))
    size = "token ids × 8, decoder's × 8" if shape == SEQ2SEQ else size
    row: dict = {"model": name, "input": size}
    model, x = randomised(build(), shape), inputs(shape, 3, seed=1)
    start = time.perf_counter()
    try:
        spec = trace_spec(model, x)
    except TraceError as exc:
        return row | {"result": "refused", "reason": str(exc), "trace_s": round(time.perf_counter() - start, 2)}
    row |= {"result": "traced", "trace_s": round(time.perf_counter() - start, 2), "groups": len(spec.groups)}
    twin = permuted(model, spec, seed=1)
    y, y_twin = logits(model, x), logits(twin, x)
    row |= {
        "headed": len(spec.heads),
        "invariance": float((y - y_twin).abs().max() / y.abs().max()),
        "spread": float((y[0] - y[1]).abs().max() / y.abs().max()),  # the outputs depend on the input
        "pinned_units": sum(p.units for p in spec.pinned),
        "pinned_streams": sum(p.stream for p in spec.pinned),
        "pinned_share": pinned_share(spec, model.state_dict()),
    }
    start = time.perf_counter()
    row["wm_exact"] = recovered(model, twin, spec, x)
    row["wm_s"] = round(time.perf_counter() - start, 2)
    return row | kinds(model, x)


def kinds(model: nn.Module, x: torch.Tensor | dict[str, torch.Tensor]) -> dict:
    """The kinds of the canonical copy (``lmclab.canonicalize``, then ``trace_spec(…, symmetry="orthogonal")``):
    how many groups of each kind (headed ones apart: orthogonal inside each head), why the widest group (a residual
    stream) is no wider kind, and the outputs' largest change under a random element of every group of its kind
    (orthogonal maps where proved)."""
    canonical = canonicalize(model, x)
    spec = trace_spec(canonical, x, symmetry="orthogonal")
    named = [f"{k} inside heads" if g in spec.heads else k for g, k in spec.kinds.items()]
    found = {kind: named.count(kind) for kind in sorted(set(named))}
    widest = max(spec.groups, key=lambda g: len(spec.groups[g]))
    out: dict = {"kinds": found, "widest_kind": spec.kinds.get(widest, "permutation")}
    if widest not in spec.kinds:
        out["widest_reason"] = spec.kind_reasons.get(widest, "")
    if spec.kinds:
        state = canonical.state_dict()
        gen = torch.Generator().manual_seed(2)
        twin = copy.deepcopy(canonical)
        twin.load_state_dict(
            apply_permutation(spec, random_permutation(spec.group_sizes(state), gen, spec.heads, spec.kinds), state)
        )
        y, y_twin = logits(model, x), logits(twin, x)
        out["kind_invariance"] = float((y - y_twin).abs().max() / y.abs().max())
    return out


def provenance(argv: list[str]) -> dict:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    libraries = ("torch", "torchvision", "timm", "transformers")
    return {
        "command": " ".join(["python tools/trace_coverage.py", shlex.join(argv)]).strip(),
        "commit": commit,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
        "threads": torch.get_num_threads(),
        "versions": {"python": platform.python_version()} | {lib: version(lib) for lib in libraries},
    }


def reason(text: str) -> str:
    """The refusal's reason for the table: the node and why, without the tracer's common words."""
    text = text.removeprefix("trace_spec: ").split("; pass partial=True")[0]
    return text.replace(" cannot be proved permutation-equivariant", "").replace("|", "\\|")


def row_line(r: dict) -> str:
    name = r["model"].replace(":", " `") + "`"
    if r["result"] == "refused":
        return f"| {name} | {r['input']} | refused: {reason(r['reason'])} | — | — | — | — | — | {r['trace_s']:.2f} |"
    groups = f"{r['groups']} ({r['headed']} headed)" if r["headed"] else str(r["groups"])
    exact = "yes" if r["wm_exact"] else "no"
    return (
        f"| {name} | {r['input']} | traced | {groups} | {left_unpermuted(r)} | {r['invariance']:.0e} | {exact} "
        f"({r['wm_s']:.1f} s) | {kinds_cell(r)} | {r['trace_s']:.2f} |"
    )


def kinds_cell(r: dict) -> str:
    """The groups of the canonical copy wider than permutation groups, with the outputs' change under random
    elements of them; and why the widest group (a residual stream) is no wider, where it is not."""
    why = r.get("widest_reason", "").replace("|", "\\|")
    if not r["kinds"]:
        return f"none: {why}"
    found = ", ".join(f"{n} {kind}" for kind, n in r["kinds"].items())
    found += f", not the widest group ({why})" if r["widest_kind"] == "permutation" else ""
    return f"{found}; {r['kind_invariance']:.0e}"


def left_unpermuted(r: dict) -> str:
    """What the trace pins (``spec.pinned``): units, the residual streams among them, the share of parameters."""
    if not r["pinned_units"]:
        return "none"
    streams = f", {r['pinned_streams']} stream{'s' if r['pinned_streams'] > 1 else ''}" if r["pinned_streams"] else ""
    return f"{r['pinned_units']} units{streams} ({r['pinned_share']:.0%} of the parameters)"


def table(data: dict) -> str:
    """The Markdown section of docs/architectures.md: the provenance line and one row per model."""
    v = data["versions"]
    lines = [
        START,
        f"`{data['command']}` at commit `{data['commit'][:10]}` on {data['machine']}, {data['threads']} torch thread "
        f"({data['date'][:10]}; torch "
        f"{v['torch']}, torchvision {v['torchvision']}, timm {v['timm']}, transformers {v['transformers']}):",
        "",
        "| model | input | result | groups | left unpermuted | outputs under a random permutation (max rel. change) "
        "| WM recovers θb = π(θa) exactly | orthogonal and centred groups of the canonical copy; outputs under random "
        "elements of them | trace s |",
        "|---|---|---|---|---|---|---|---|---|",
        *map(row_line, data["models"]),
        END,
    ]
    return "\n".join(lines)


def write_docs(path: Path, data: dict) -> None:
    text = path.read_text()
    head, rest = text.split(START)
    path.write_text(head + table(data) + rest.split(END, 1)[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated names of MODELS")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--docs", action="store_true", help="regenerate the docs table from --out only")
    args = parser.parse_args()
    if not args.docs:
        rows = []
        for name in args.models.split(","):
            rows.append(measure(name))
            print(row_line(rows[-1]), flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(provenance(sys.argv[1:]) | {"models": rows}, indent=1) + "\n")
    if args.docs or args.out.resolve() == OUT:  # a few models into another file leave the table alone
        write_docs(DOCS, json.loads(args.out.read_text()))


if __name__ == "__main__":
    main()
