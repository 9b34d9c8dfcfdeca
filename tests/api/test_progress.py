"""``progress=True`` shows a tqdm bar on stderr (the curve's λ values, an iterative search's epochs);
without it nothing is written."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

import lmclab


def _mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 3))


def test_the_curve_and_an_iterative_search_show_bars_only_when_asked(capfd) -> None:
    a, b, data = _mlp(0), _mlp(1), (torch.randn(32, 12), torch.randint(0, 3, (32,)))
    lmclab.curve(a, b, eval_data=data, num_lambdas=3)
    lmclab.find_permutation(a, b, method="ste", data=data, options={"epochs": 2, "batch_size": 8})
    assert capfd.readouterr().err == ""
    lmclab.curve(a, b, eval_data=data, num_lambdas=3, progress=True)
    err = capfd.readouterr().err
    assert "curve:" in err and "/3 " in err and "λ/s" in err  # a bar over the 3 λ values
    lmclab.find_permutation(a, b, method="ste", data=data, options={"epochs": 2, "batch_size": 8}, progress=True)
    err = capfd.readouterr().err
    assert "ste:" in err and "epoch/s" in err
    assert not err.endswith("\n") and err.rstrip(" ").endswith("\r")  # the search's bar is cleared when it ends


def test_a_search_s_bar_redraws_at_tqdm_s_pace_not_at_every_epoch(capfd, monkeypatch) -> None:
    # an epoch's l2 waits for the next redraw tqdm has due: cheap epochs write no line each to a log of stderr
    import lmclab.search as search

    monkeypatch.setattr(search, "tqdm", partial(search.tqdm, mininterval=1e9))  # no redraw is due in the run
    a, b, data = _mlp(0), _mlp(1), (torch.randn(32, 12), torch.randint(0, 3, (32,)))
    lmclab.find_permutation(a, b, method="ste", data=data, options={"epochs": 2, "batch_size": 8}, progress=True)
    err = capfd.readouterr().err
    assert err.count("ste:") == 1 and "l2=" not in err  # drawn when it opens, then only cleared


def test_weight_matching_activation_matching_and_merge_many_tick_their_own_steps(capfd, monkeypatch) -> None:
    """WM: one step per sweep (its sweep count is in its stats); AM: one per batch; MergeMany: its WM sweeps
    and one per pass; a bar on stderr, and nothing without ``progress``."""
    import lmclab.core.progress as progress

    counted: list[tuple[str, int]] = []

    class Counting(progress.tqdm):
        def close(self) -> None:
            if not self.disable:  # tqdm closes once more when collected
                counted.append((self.desc, self.n))
            super().close()

    monkeypatch.setattr(progress, "tqdm", Counting)
    a, b, c = _mlp(0), _mlp(1), _mlp(2)
    x = torch.randn(40, 12)
    found = lmclab.find_permutation(a, b, example_inputs=x[:2], options={"restarts": 1})
    lmclab.merge_many([a, b, c], example_inputs=x[:2], options={"max_iter": 2})
    assert capfd.readouterr().err == "" and counted == []
    lmclab.find_permutation(a, b, example_inputs=x[:2], options={"restarts": 1}, progress=True)
    assert counted == [("wm", found.stats["sweeps"])] and "wm:" in capfd.readouterr().err
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, torch.zeros(40).long()), batch_size=16)
    lmclab.find_permutation(a, b, method="am", data=loader, progress=True)
    assert counted[-1] == ("am", 3)  # 16 + 16 + 8 samples
    many = lmclab.merge_many([a, b, c], example_inputs=x[:2], options={"max_iter": 2}, progress=True)
    passes = len(many.stats["distance"]) - 1 if "distance" in many.stats else None
    assert counted[-1][0] == "merge_many" and counted[-1][1] > (passes or 0) > 0, (counted, many.stats)


def test_weight_matching_s_bar_shows_the_objective_after_each_sweep(capfd, monkeypatch) -> None:
    """Beside the bar, each sweep's ⟨θa, π(θb)⟩ to 4 significant digits, the one of the sweep just done; the bar
    counts steps."""
    import lmclab.core.progress as progress

    shown: list[tuple[str, str]] = []

    class Showing(progress.tqdm):
        def set_postfix(self, *args, **kwargs) -> None:
            super().set_postfix(*args, **kwargs)
            shown.append((self.unit, self.postfix))

    def deep(seed: int) -> nn.Module:  # a sweep changes the next one's costs: several sweeps, each gaining
        torch.manual_seed(seed)
        return nn.Sequential(*(m for w in (12, 16, 16) for m in (nn.Linear(w, 16), nn.ReLU())), nn.Linear(16, 3))

    monkeypatch.setattr(progress, "tqdm", Showing)
    x = torch.randn(2, 12)
    found = lmclab.find_permutation(deep(0), deep(1), example_inputs=x, options={"restarts": 1}, progress=True)
    values = found.stats["objective"][1:]
    assert len({f"{v:.4g}" for v in values}) >= 3  # measured 5.945, 6.504, 6.545 and 6.545 again
    assert shown == [("step", f"objective={v:.4g}") for v in values]
    assert "wm: 0step [00:00, ?step/s]" in capfd.readouterr().err  # drawn when it opens
