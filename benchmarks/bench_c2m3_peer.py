"""C2M3's own Frank–Wolfe matcher and lmclab's ``c2m3`` side by side on the same N checkpoints, in one
process, interleaved per repeat ("Side by side"); MergeMany as a third row.

The peer (github.com/crisostomi/cycle-consistent-model-merging, Crisostomi et al., NeurIPS 2024) is *not*
part of lmclab: check it out anywhere outside the project and pass its folder as ``--peer``; nothing of it
is copied here, it is imported at run time from ``<peer>/src``. Its package ``ccmm`` imports much more
than the matcher needs (Lightning, wandb, nn-template-core, torchviz, …): install those, without their
dependencies where they would replace lmclab's pinned packages, into a folder of their own and pass it as
``--site``; it is appended to ``sys.path``, so lmclab's packages always win::

    pip install --no-deps --target /work/peers/site backports.strenum graphviz torchviz \\
        nn-template-core==0.4.0 lightning pytorch-lightning lightning-utilities torchmetrics
    pip install --target /work/peers/site wandb          # its own dependencies (protobuf, …) too
    python benchmarks/bench_c2m3_peer.py --models data/models --data data/prepared \\
        --peer /work/peers/c2m3 --site /work/peers/site --seeds 0,1,2,3 \\
        --out benchmarks/results/c2m3_peer.json --render docs/c2m3_peer.md

The peer runs as its ``FrankWolfeSynchronizedMerger`` calls it (conf/matching/merger/
frank_wolfe_to_universe.yaml: ``frank_wolfe_synchronized_matching`` over the canonical pairs i < j,
``max_iter`` 200, hard permutations), on the lmclab checkpoints renamed to its MLP's parameter names and
with its own ``MLPPermutationSpecBuilder``, but by default from its ``initialization_method`` "identity"
(the default of its matcher config, conf/matching/matcher/frank_wolfe_sync.yaml) instead of the merger
config's "sinkhorn": that start runs its ``sinkhorn_knopp`` to a tolerance of 1e-8, which float32 never
reaches, so each 512 × 512 matrix takes the full 10,000 iterations, 60–95 s on a shared 2-core CPU and
12–19 min per run for 4 models × 3 groups before the first Frank–Wolfe step (``--peer-init sinkhorn``).
What had to change at run time (no file of the peer is edited; :data:`RUNTIME_PATCHES`, also written to the JSON):

1. ``torch.Tensor.cuda`` returns the tensor itself while the peer runs (``update_perm_matrices_sync``
   calls ``.cuda()`` unconditionally; there is no GPU here); ``device="cpu"`` is passed as its argument;
2. ``initialize_perturbed_uniform``'s default ``device="cuda"`` becomes "cpu" (its caller, the "sinkhorn"
   initialisation, passes no device);
3. the dense debug check of ``compute_grad_P_curr_sync`` / ``compute_grad_P_prev_sync`` (default
   ``debug=True``: every gradient recomputed with dense matrix products and ``assert``-ed equal) is
   turned off through their default argument (``--peer-debug`` keeps it);
4. ``scipy.misc.derivative`` (removed in SciPy 1.12; imported by ``ccmm.utils.utils`` for a plot
   helper the matcher never calls) is set to a function that raises;
5. the global torch generator is seeded before each peer run (its "sinkhorn" start draws from it).

Scoring, the same for every row: the shared objective ``F = Σ_{i<j} ⟨π_i θ_i, π_j θ_j⟩`` of the rounded
permutations (:func:`lmclab.search.universe.shared_objective` on the aligned models), the merged model
(mean of the aligned models) on test and train with and without REPAIR
(:func:`lmclab.core.repair.repair_merged`), the cycle error of the pairwise maps, iterations, and the
median wall time over ``--repeats`` runs that alternate the methods. The peer's permutations are
converted to lmclab's convention (:func:`peer_to_lmclab`) and the conversion is checked twice: the
models aligned by lmclab with the converted permutations equal the peer's own
``apply_permutation_to_statedict`` output (as its merger applies them), and ``F`` equals the peer's own
objective ``get_all_pairs_global_obj_sync`` evaluated at its rounded permutation matrices.

``--render docs/c2m3_peer.md`` writes the results page from the JSON (``--no-run``: from an existing JSON).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import scipy
import torch
from record import record, this_run  # benchmarks/record.py: the one shape of a result
from torch import Tensor

import lmclab
from lmclab.archs import build_model, get_arch
from lmclab.archs.checkpoint import load_checkpoint
from lmclab.core.data import load_split
from lmclab.core.evaluate import evaluate
from lmclab.core.repair import repair_merged
from lmclab.core.spec import Permutation, identity_permutation
from lmclab.search.c2m3 import c2m3
from lmclab.search.merge_many import merge_many
from lmclab.search.universe import aligned_models, cycle_error, mean_params, pairwise_maps, shared_objective

ROOT = Path(__file__).resolve().parent.parent
PEER_URL = "https://github.com/crisostomi/cycle-consistent-model-merging"
RUNTIME_PATCHES = [
    "torch.Tensor.cuda replaced by the identity (returns the tensor itself) while the peer's matcher runs: "
    "update_perm_matrices_sync calls .cuda() unconditionally; device='cpu' passed as the matcher's argument",
    "ccmm.matching.frank_wolfe_matching.initialize_perturbed_uniform.__defaults__ = ('cpu',) (was 'cuda'; "
    "the 'sinkhorn' initialisation calls it without a device)",
    "compute_grad_P_curr_sync / compute_grad_P_prev_sync.__defaults__ = (False,): their dense debug check "
    "(gradient recomputed with dense matrix products and asserted equal) off, as no caller passes debug",
    "scipy.misc.derivative set to a function that raises (removed in SciPy 1.12; ccmm.utils.utils imports it "
    "for a plot helper the matcher never calls)",
    "torch.manual_seed(seed) before each peer run (its 'sinkhorn' start draws from the global generator)",
    "the peer's third-party imports (Lightning, wandb, nn-template-core, torchviz, graphviz, backports.strenum) "
    "come from --site, appended to sys.path after lmclab's environment",
]


INIT_NOTE = (
    "The peer starts from its matcher config's `initialization_method: identity`, not its merger config's "
    "`sinkhorn`: that start runs `sinkhorn_knopp` to a tolerance of 1e-8, which float32 never reaches, so each "
    "512 × 512 matrix takes its full 10,000 iterations (60–95 s each in a separate trial on this machine, "
    "12–19 min per run before the first Frank–Wolfe step); that start was not run."
)


# --- the peer, imported at run time -------------------------------------------------------------------


def import_peer(peer: Path, site: Path | None, *, debug: bool) -> dict:
    """The peer's modules (``<peer>/src`` first on the path, ``site`` last), with patches 2–4 applied."""
    import scipy.misc

    def derivative(*args, **kwargs):
        raise NotImplementedError("scipy.misc.derivative was removed in SciPy 1.12 (runtime patch)")

    scipy.misc.derivative = derivative
    sys.path.insert(0, str(peer / "src"))
    if site is not None:
        sys.path.append(str(site))
    fw = importlib.import_module("ccmm.matching.frank_wolfe_matching")
    sync = importlib.import_module("ccmm.matching.frank_wolfe_sync_matching")
    fw.initialize_perturbed_uniform.__defaults__ = ("cpu",)
    sync.compute_grad_P_curr_sync.__defaults__ = (debug,)
    sync.compute_grad_P_prev_sync.__defaults__ = (debug,)
    return {
        "sync": sync,
        "spec": importlib.import_module("ccmm.matching.permutation_spec"),
        "utils": importlib.import_module("ccmm.matching.utils"),
    }


@contextlib.contextmanager
def no_cuda():
    """``Tensor.cuda`` as the identity, restored afterwards (patch 1)."""
    original = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        torch.Tensor.cuda = original


def peer_names(hidden: int) -> dict[str, str]:
    """lmclab's MLP parameter names → the peer's (``layers.i`` → ``layer{i}``, ``out`` → ``layer{hidden}``)."""
    names = {f"layers.{i}.{p}": f"layer{i}.{p}" for i in range(hidden) for p in ("weight", "bias")}
    return names | {f"out.{p}": f"layer{hidden}.{p}" for p in ("weight", "bias")}


def run_peer(peer: dict, peer_spec, params: Sequence[Mapping[str, Tensor]], *, max_iter: int, init: str, seed: int):
    """The peer's matcher as its merger calls it: its rounded indices per symbol, its info, seconds."""
    symbols = [str(i) for i in range(len(params))]
    combos = [(a, b) for a, b in peer["utils"].get_all_symbols_combinations(symbols) if a < b]
    torch.manual_seed(seed)
    start = time.perf_counter()
    with no_cuda():
        indices, info = peer["sync"].frank_wolfe_synchronized_matching(
            params=dict(zip(symbols, params, strict=True)),
            perm_spec=peer_spec,
            symbols=symbols,
            combinations=combos,
            max_iter=max_iter,
            initialization_method=init,
            keep_soft_perms=False,
            device="cpu",
        )
    return [indices[s] for s in symbols], info, time.perf_counter() - start


def peer_to_lmclab(indices: Mapping[str, Tensor]) -> Permutation:
    """The peer's rounded ``P_i`` (row r → column ``c[r]``; ``P_iᵀ`` maps model i to the universe) as
    lmclab's ``π_i[g][k]`` = the unit of model i landing on universe unit k, i.e. ``c⁻¹``."""
    return {g: torch.as_tensor(c).long().argsort() for g, c in indices.items()}


def check_conversion(peer: dict, peer_spec, names, spec, indices, params, perms) -> dict:
    """The two checks of the module docstring: aligned models equal, objectives equal."""
    utils, sync = peer["utils"], peer["sync"]
    renamed = [{names[k]: v for k, v in p.items()} for p in params]
    diff = 0.0
    for idx, p_peer, p_lm in zip(indices, renamed, aligned_models(spec, perms, params), strict=True):
        # the merger's own application: P → Pᵀ → indices → index_select per axis
        to_apply = {
            g: utils.perm_matrix_to_perm_indices(utils.perm_indices_to_perm_matrix(c).T) for g, c in idx.items()
        }
        theirs = utils.apply_permutation_to_statedict(peer_spec, to_apply, p_peer)
        diff = max(diff, max(float((theirs[names[k]] - v).abs().max()) for k, v in p_lm.items()))
    symbols = [str(i) for i in range(len(params))]
    # float32 as the peer computes it (its identity matrices for unpermuted axes are float32)
    hard = {
        s: {g: utils.perm_indices_to_perm_matrix(c) for g, c in idx.items()}
        for s, idx in zip(symbols, indices, strict=True)
    }
    combos = [(a, b) for i, a in enumerate(symbols) for b in symbols[i + 1 :]]
    theirs_f = float(
        sync.get_all_pairs_global_obj_sync(
            dict(zip(symbols, renamed, strict=True)), combos, hard, peer_spec.layer_and_axes_to_perm, "cpu"
        )
    )
    ours_f = shared_objective(spec, aligned_models(spec, perms, params))
    return {
        "aligned_max_abs_diff": diff,
        "peer_objective_of_rounded": theirs_f,
        "lmclab_shared_objective": ours_f,
        "relative_difference": abs(theirs_f - ours_f) / abs(ours_f),
    }


# --- scoring ----------------------------------------------------------------------------------------------


def score(model, spec, params, perms: Sequence[Permutation], splits) -> dict:
    """F, cycle error, merged and REPAIRed merged model on every split."""
    aligned = aligned_models(spec, perms, params)
    row = {
        "objective": shared_objective(spec, aligned),
        "cycle_error": cycle_error(pairwise_maps(perms), len(perms)),
    }
    merged, repaired = mean_params(aligned), repair_merged(model, aligned, splits["train"])
    for split, data in splits.items():
        for tag, p in (("", merged), ("repair_", repaired)):
            ev = evaluate(model, p, data)
            row[f"{tag}{split}_acc"], row[f"{tag}{split}_loss"] = ev.acc, ev.loss
    return row


def run(args: argparse.Namespace) -> dict:
    peer = import_peer(args.peer, args.site, debug=args.peer_debug)
    ckpts = [load_checkpoint(args.models / f"seed{s}.pt") for s in args.seeds]
    arch, config = ckpts[0].arch, ckpts[0].config
    spec, model = get_arch(arch).permutation_spec(config), build_model(arch, config)
    params = [c.state_dict for c in ckpts]
    names = peer_names(config.hidden)
    peer_spec = peer["spec"].MLPPermutationSpecBuilder(config.hidden).create_permutation_spec()
    renamed = [{names[k]: v for k, v in p.items()} for p in params]
    assert set(peer_spec.layer_and_axes_to_perm) == set(renamed[0]), "peer spec and renamed keys differ"
    assert set(peer_spec.perm_to_layers_and_axes) == set(spec.group_sizes(params[0])), "group names differ"
    splits = {"test": load_split(args.data, "test"), "train": load_split(args.data, "train")}

    methods = {
        "lmclab c2m3": lambda: c2m3(spec, params, generator=torch.Generator().manual_seed(args.seed)),
        "peer C2M3 (frank_wolfe_synchronized_matching)": lambda: run_peer(
            peer, peer_spec, renamed, max_iter=args.peer_max_iter, init=args.peer_init, seed=args.seed
        ),
        "lmclab merge_many": lambda: merge_many(
            spec, params, max_iter=args.mm_max_iter, tol=args.mm_tol, generator=torch.Generator().manual_seed(args.seed)
        ),
    }
    seconds, results = {m: [] for m in methods}, {m: [] for m in methods}
    for repeat in range(args.repeats):
        order = list(methods) if repeat % 2 == 0 else list(reversed(methods))
        for m in order:
            start = time.perf_counter()
            out = methods[m]()
            seconds[m].append(time.perf_counter() - start)
            results[m].append(out)
            print(f"repeat {repeat} {m}: {seconds[m][-1]:.1f} s", flush=True)

    rows, check = [], None
    for m, outs in results.items():
        if m.startswith("peer"):
            perms_all = [[peer_to_lmclab(i) for i in out[0]] for out in outs]
            info = outs[0][1]
            extra = {
                "iterations": len(info["obj_values"]),
                "relaxed_objective_final": float(info["obj_values"][-1]),
                "relaxed_objective_trace": [float(v) for v in info["obj_values"]],
                "own_seconds": [o[2] for o in outs],
            }
            check = check_conversion(peer, peer_spec, names, spec, outs[0][0], params, perms_all[0])
        else:
            perms_all = [o.perms for o in outs]
            extra = {"iterations": outs[0].stats["iterations"], "own_seconds": [o.stats["seconds"] for o in outs]}
            if "objective" in outs[0].stats:
                extra["relaxed_objective_final"] = outs[0].stats["objective"][-1]
                extra["relaxed_objective_trace"] = [float(v) for v in outs[0].stats["objective"]]
        same = all(
            all(torch.equal(a[g], b[g]) for g in a) for p in perms_all[1:] for a, b in zip(p, perms_all[0], strict=True)
        )
        row = {"method": m, **score(model, spec, params, perms_all[0], splits), **extra}
        rows.append(
            {
                **row,
                "seconds": statistics.median(seconds[m]),
                "seconds_all": seconds[m],
                "same_perms_every_repeat": same,
            }
        )
    naive = [identity_permutation(spec.group_sizes(p)) for p in params]
    rows.append({"method": "naive average (no alignment)", **score(model, spec, params, naive, splits)})
    endpoints = [
        {"seed": s, **{f"{k}_acc": evaluate(model, p, d).acc for k, d in splits.items()}}
        for s, p in zip(args.seeds, params, strict=True)
    ]
    ours = provenance(Path(lmclab.__file__).resolve().parents[2], "src")
    measured = this_run(
        lmclab={"path": ours["path"], "dirty": ours["dirty"]},
        peer={"url": PEER_URL, **provenance(args.peer, ".")},
        **environment(),
    )
    return {
        "run": measured,
        "settings": {
            "seeds": args.seeds,
            "arch": arch,
            "config": repr(config),
            "repeats": args.repeats,
            "seed": args.seed,
            "lmclab_c2m3": "defaults (max_iter 100, tol 1e-9, init sinkhorn_barycenter), float64",
            "peer": f"max_iter {args.peer_max_iter}, initialization {args.peer_init!r}, canonical pairs i<j, "
            f"hard perms, float32, debug check {'on' if args.peer_debug else 'off'}",
            "merge_many": f"max_iter {args.mm_max_iter}, tol {args.mm_tol} (params.yaml merge_many)",
            "repair": "lmclab.core.repair.repair_merged on the training split, default points, batch 500",
        },
        "runtime_patches": RUNTIME_PATCHES,
        "conversion_check": check,
        "endpoints": endpoints,
        "rows": rows,
    }


def provenance(repo: Path, sub: str) -> dict:
    def git(*cmd: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *cmd], capture_output=True, text=True).stdout.strip()

    return {"path": str(repo), "commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", sub))}


def environment() -> dict:
    """What the run's record adds to its machine: the load at the end and the versions the comparison used."""
    versions = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__}
    with contextlib.suppress(ImportError):
        import pytorch_lightning

        versions["pytorch_lightning (peer's site)"] = pytorch_lightning.__version__
    return {
        "load_average_1min_at_end": round(os.getloadavg()[0], 2),  # the 2 cores are shared with other jobs
        "versions": versions | {"scipy": scipy.__version__},
    }


# --- the results page -------------------------------------------------------------------------------------


def capped(result: dict) -> str:
    """The note on a peer run stopped before its config's 200 iterations, with both relaxed traces."""
    peer = next(r for r in result["rows"] if r["method"].startswith("peer"))
    ours = next(r for r in result["rows"] if r["method"] == "lmclab c2m3")
    n, trace = peer["iterations"], ours["relaxed_objective_trace"]
    per = peer["seconds"] / n
    at = trace[min(n, len(trace) - 1)]
    return (
        f"The peer ran {n} iterations, not its config's 200 (it stops earlier only after 5 iterations that raise "
        f"its objective by < 1e-6; at {per:.0f} s per iteration here 200 take about {200 * per / 3600:.1f} h). "
        f"Its relaxed objective was {peer['relaxed_objective_trace'][0]:.2f} after its first iteration, "
        f"{peer['relaxed_objective_trace'][-1]:.2f} after its last "
        f"(last step +{peer['relaxed_objective_trace'][-1] - peer['relaxed_objective_trace'][-2]:.3f}); lmclab's "
        f"relaxed objective after {min(n, len(trace) - 1)} of its iterations: {at:.2f}, at its stop: {trace[-1]:.2f}."
    )


def timing(repeats: int, m: dict, rows: list[dict]) -> str:
    load = f"load average {m['load_average_1min_at_end']} on {m['cores']} cores at the end of the run"
    timed = [r["seconds"] for r in rows if "seconds" in r]
    if repeats >= 3:
        return f"Seconds: median of {repeats} runs alternating the methods (each run listed; {load})."
    return (
        f"Seconds: **{repeats} run only** ({load}: the machine is shared, and the {sum(timed):.0f} s of one run "
        "of every method made 3 alternating repeats too long for the time of this benchmark); lone timings "
        "drift by 50 %."
    )


def render(result: dict) -> str:
    """docs/c2m3_peer.md from the JSON (never typed by hand)."""
    (run,) = result["runs"]  # the one shape of benchmarks/record.py
    extra = {k: run[k] for k in ("load_average_1min_at_end", "versions") if k in run}
    s, m, chk = result["settings"], {**run["machine"], **extra}, result["conversion_check"]
    url = run["peer"]["url"]
    head = (
        "| method | F = Σ⟨π_iθ_i, π_jθ_j⟩ | iterations | seconds (median) | cycle error | test acc "
        "| test acc, REPAIR | train acc | train acc, REPAIR | test loss | test loss, REPAIR |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in result["rows"]:
        sec = f"{r['seconds']:.1f} ({', '.join(f'{x:.1f}' for x in r['seconds_all'])})" if "seconds" in r else "–"
        lines.append(
            f"| {r['method']} | {r['objective']:.2f} | {r.get('iterations', '–')} | {sec} | {r['cycle_error']:.3f} "
            f"| {100 * r['test_acc']:.2f} % | {100 * r['repair_test_acc']:.2f} % | {100 * r['train_acc']:.2f} % "
            f"| {100 * r['repair_train_acc']:.2f} % | {r['test_loss']:.4f} | {r['repair_test_loss']:.4f} |"
        )
    ends = ", ".join(f"seed {e['seed']}: {100 * e['test_acc']:.2f} %" for e in result["endpoints"])
    dirty = " (src/ with uncommitted changes)" if run["lmclab"]["dirty"] else ""
    return "\n".join(
        [
            "# C2M3 side by side: the authors' Frank–Wolfe matcher and lmclab's `c2m3`",
            "",
            "<!-- generated by benchmarks/bench_c2m3_peer.py --render "
            "from benchmarks/results/c2m3_peer.json; do not edit -->",
            "",
            f"{len(s['seeds'])} MLPs of the default run (seeds {', '.join(map(str, s['seeds']))}; `{s['config']}`) "
            "merged into one universe frame by lmclab's `c2m3`, by the C2M3 authors' own "
            f"`frank_wolfe_synchronized_matching` ([{url.removeprefix('https://')}]({url}) "
            f"at `{run['peer']['commit'][:7]}`, imported at run time, not part of lmclab) "
            "and by lmclab's MergeMany, "
            "in one process. Every row is scored by the same functions: F of the rounded permutations "
            "(`lmclab.search.universe.shared_objective`), the merged model (mean of the aligned models) "
            "with and without REPAIR (`lmclab.core.repair.repair_merged`, training split), the cycle error "
            f"of the pairwise maps. {timing(s['repeats'], m, result['rows'])}",
            "",
            *lines,
            "",
            f"Endpoints' test accuracy: {ends}.",
            "",
            f"Settings: lmclab c2m3 {s['lmclab_c2m3']}; peer {s['peer']}; MergeMany {s['merge_many']}.",
            *(["", INIT_NOTE] if "'identity'" in s["peer"] else []),
            *(["", capped(result)] if "max_iter 200," not in s["peer"] else []),
            "",
            "**Permutation conversion.** The peer's rounded `P_i` maps universe to model (`P_iᵀ` takes model i "
            "into the universe); lmclab's `π_i[g][k]` is the unit of model i that lands on universe unit k, so "
            "`π_i = argsort(c_i)` with `c_i` the peer's column indices. Checked on the peer's result: the models "
            "aligned by lmclab with the converted permutations differ from the peer's own "
            f"`apply_permutation_to_statedict` output by at most {chk['aligned_max_abs_diff']:.1e}, and the peer's "
            f"own objective at its rounded matrices, {chk['peer_objective_of_rounded']:.4f}, equals lmclab's F, "
            f"{chk['lmclab_shared_objective']:.4f} (relative difference {chk['relative_difference']:.1e}).",
            "",
            "**Run-time changes to the peer** (no file of it edited):",
            "",
            *[f"- {p}" for p in result["runtime_patches"]],
            "",
            f"Command: `{run['command']}`  ",
            f"lmclab commit `{run['commit']}`{dirty}, peer commit `{run['peer']['commit']}`  ",
            f"Machine: {m['cpu']}, {m['cores']} cores ({m['torch_threads']} torch threads); "
            + ", ".join(f"{k} {v}" for k, v in m["versions"].items())
            + f"; {run['date']}",
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=ROOT / "data" / "models", help="folder of seed{s}.pt")
    parser.add_argument("--data", type=Path, default=ROOT / "data" / "prepared", help="prepared data folder")
    parser.add_argument("--peer", type=Path, help="checkout of crisostomi/cycle-consistent-model-merging")
    parser.add_argument("--site", type=Path, help="folder with the peer's third-party packages")
    parser.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2, 3])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each method, alternating")
    parser.add_argument("--seed", type=int, default=0, help="seeds every method's randomness")
    parser.add_argument("--peer-max-iter", type=int, default=200, help="the peer merger's max_iter (its config: 200)")
    parser.add_argument("--peer-init", default="identity", choices=["identity", "sinkhorn"], help="module docstring")
    parser.add_argument("--peer-debug", action="store_true", help="keep the peer's dense debug check on")
    parser.add_argument("--mm-max-iter", type=int, default=3, help="MergeMany passes (params.yaml merge_many)")
    parser.add_argument("--mm-tol", type=float, default=1e-4, help="MergeMany tolerance (params.yaml merge_many)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "c2m3_peer.json")
    parser.add_argument("--render", type=Path, help="write the Markdown page generated from the JSON here")
    parser.add_argument("--no-run", action="store_true", help="only render the existing --out JSON")
    args = parser.parse_args()
    if not args.no_run:
        if args.peer is None:
            parser.error("--peer is required unless --no-run")
        result = run(args)
        rows, measured = result.pop("rows"), result.pop("run")
        record(args.out, rows, run=measured, **result)
    if args.render:
        args.render.write_text(render(json.loads(args.out.read_text())))


if __name__ == "__main__":
    main()
