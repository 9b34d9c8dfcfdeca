"""ZipIt!'s α and β (Stoica et al. 2024, Section 4.3; :mod:`lmclab.search.zipit`): the defaults are the
plain greedy; on hand-made correlations α changes the merge order exactly where a closed form says, its
penalty compounding per merge; β allows exactly ⌊β·⌊(D − n)/N⌋⌋ same-model merges per model (none for
a budget of 0, unlike the authors' code) and is moot across models; the cached greedy gives the merges of
a full-rescan greedy written here, on random, tie-heavy, asymmetric and NaN matrices; zipit passes both
options on; bad values are one line naming them."""

from __future__ import annotations

import math

import pytest
import torch
from test_cca_zipit import PLAIN, _reference_zip_clusters, data, mlp

from lmclab.search.features import feature_statistics
from lmclab.search.zipit import ZipItOptions, cluster_transforms, zip_clusters, zip_merges, zipit


def symmetric(size: int, entries: dict[tuple[int, int], float]) -> torch.Tensor:
    corr = torch.eye(size, dtype=torch.float64)
    for (a, b), v in entries.items():
        corr[a, b] = corr[b, a] = v
    return corr


def same_model_merges(merges, sizes) -> list[int]:
    """Per model, the merges whose two clusters are represented (lowest feature) by that model."""
    counts = [0] * len(sizes)
    for i, j in merges:
        if i // sizes[0] == j // sizes[0]:
            counts[i // sizes[0]] += 1
    return counts


def test_defaults_are_the_plain_greedy_and_reach_zipit_unchanged():
    """α = 1 and β = null by default, and zipit's merge is then the one of the greedy before α and β
    (test_cca_zipit's copy); with α and β set, zipit's merge is zip_clusters' with them."""
    assert (ZipItOptions().alpha, ZipItOptions().beta) == (1.0, None)
    model, spec, points, params_a = mlp(0)
    params = [params_a, mlp(1)[3], mlp(2)[3]]
    x = data()
    stats = feature_statistics(model, params, points, x)
    for options in [{}, {"alpha": 0.3, "beta": 0.0}]:
        result = zipit(spec, params, model=model, points=points, data=x, **options)
        for g, s in stats.items():
            corr = s.correlation()
            if options:
                clusters = zip_clusters(corr, s.sizes, True, **options)
                assert clusters != _reference_zip_clusters(corr, s.sizes, True)  # the options changed something
            else:
                clusters = _reference_zip_clusters(corr, s.sizes, True)
            merges = cluster_transforms(clusters, s.sizes)[0]
            assert all(torch.equal(result.merges[i][g], merges[i]) for i in range(3))


def test_alpha_steers_a_grown_cluster_away_at_the_closed_form_threshold():
    """a, b of model 0 and c, d of model 1: ρ(a,c) = .9 merges first; then {a,c} links to b at .8α and
    d at .1α, against ρ(b,d) = .5: b joins {a,c} iff .8α > .5, i.e. α > .625."""
    corr = symmetric(4, {(0, 2): 0.9, (0, 1): 0.8, (1, 2): 0.8, (0, 3): 0.1, (2, 3): 0.1, (1, 3): 0.5})
    for alpha, clusters in [(1.0, [[0, 1, 2], [3]]), (0.63, [[0, 1, 2], [3]]), (0.62, [[0, 2], [1, 3]])]:
        assert zip_clusters(corr, [2, 2], True, alpha=alpha, beta=None) == clusters


@pytest.mark.parametrize(
    ("alpha", "merges"),
    [
        (1.0, [(0, 1), (0, 2), (0, 3), (0, 4)]),
        (0.93, [(0, 1), (0, 2), (0, 3), (0, 4)]),  # 0.7 α² = .6054 > .6
        (0.92, [(0, 1), (0, 2), (3, 4), (0, 3)]),  # 0.7 α² = .5925 < .6
        (0.88, [(0, 1), (0, 2), (3, 4), (0, 3)]),  # a single α (0.7 α = .616 > .6) would merge (0, 3) here
        (0.87, [(0, 1), (2, 3), (0, 2), (0, 4)]),  # .8 α = .696 < ρ(2,3) = .7
    ],
)
def test_alpha_compounds_with_every_merge(alpha, merges):
    """Five models of one feature: ρ(0,1) = .9, ρ(0,2) = ρ(1,2) = .8, ρ(k,3) = .7 for k < 3, ρ(3,4) = .6.
    After 0+1, {0,1}+2 (at .8α) beats 2+3 (.7) iff α > .875; then {0,1,2} links to 3 at
    α·min(α·.7, .7) = .7α², against ρ(3,4) = .6: 3 joins iff α > √(6/7) = .9258."""
    corr = symmetric(5, {(0, 1): 0.9, (0, 2): 0.8, (1, 2): 0.8, (0, 3): 0.7, (1, 3): 0.7, (2, 3): 0.7, (3, 4): 0.6})
    assert zip_merges(corr, [1] * 5, True, alpha=alpha, beta=None) == merges


def test_a_budget_of_zero_makes_no_same_model_merge():
    """test_cca_zipit's hand-made case: without a budget a+b (.9, model 0) merge first, then c+d. With
    b = ⌊β·⌊(4 − 2)/2⌋⌋ = 0 (β < 1) neither may (the authors' code would still merge a+b first): a+c, and
    {a,c} (represented by model 0) may not take b, so b+d; β = 1 gives each model one."""
    corr = symmetric(4, {(0, 1): 0.9, (0, 2): 0.8, (2, 3): 0.2, (1, 3): 0.1})
    unlimited, crossed = [[0, 1], [2, 3]], [[0, 2], [1, 3]]
    for beta, clusters in [(None, unlimited), (1.0, unlimited), (0.99, crossed), (0, crossed)]:
        assert zip_clusters(corr, [2, 2], True, alpha=1.0, beta=beta) == clusters


def planted_pairs(width: int = 8, seed: int = 0) -> torch.Tensor:
    """Two models whose features 2p, 2p+1 correlate at .9 − .005p (model 0) and .899 − .005p (model 1):
    the greedy's first merges, alternating between the models; across models ρ in [.2, .3)."""
    gen = torch.Generator().manual_seed(seed)
    corr = torch.zeros(2 * width, 2 * width, dtype=torch.float64)
    cross = 0.2 + 0.1 * torch.rand(width, width, generator=gen, dtype=torch.float64)
    corr[:width, width:], corr[width:, :width] = cross, cross.T
    for m in range(2):
        for p in range(width // 2):
            a = m * width + 2 * p
            corr[a, a + 1] = corr[a + 1, a] = 0.9 - 0.005 * p - 0.001 * m
    return corr.fill_diagonal_(1.0)


@pytest.mark.parametrize(
    ("width", "beta", "budget"),
    [(8, None, 4), (8, 0.0, 0), (8, 0.2, 0), (8, 0.25, 1), (8, 0.5, 2), (8, 0.75, 3), (8, 1.0, 4), (8, 3.0, 4)]
    + [(200, 0.29, 29), (200, 0.57, 57)],  # 0.29 · 100 = 28.999…, 0.57 · 100 = 56.999… in floats
)
def test_a_budget_allows_exactly_its_same_model_merges(width, beta, budget):
    """D = 2n: b = ⌊β·⌊n/2⌋⌋ (n/2 planted pairs per model bound it), spent on each model's strongest
    pairs; the other merges join the two models."""
    merges = zip_merges(planted_pairs(width), [width, width], True, alpha=1.0, beta=beta)
    assert same_model_merges(merges, [width, width]) == [budget, budget]
    same = {(i, j) for i, j in merges if i // width == j // width}
    assert same == {(m * width + 2 * p, m * width + 2 * p + 1) for m in range(2) for p in range(budget)}


def redundant_correlation(n_models: int, width: int, seed: int, decimals: int | None, skew: float) -> torch.Tensor:
    """Noisy copies of features drawn with replacement from a shared pool: within-model duplicates give
    same-model merges, shared ones cross-model merges; rounded (ties) and skewed (asymmetric) on request."""
    gen = torch.Generator().manual_seed(seed)
    pool = torch.randn(40, width, generator=gen, dtype=torch.float64)
    noise = 0.3 + float(torch.rand((), generator=gen)) * 1.5
    z = torch.cat(
        [
            pool[:, torch.randint(width, (width,), generator=gen)]
            + noise * torch.randn(40, width, generator=gen, dtype=torch.float64)
            for _ in range(n_models)
        ],
        1,
    )
    corr = torch.corrcoef(z.T)
    corr = corr + skew * torch.randn(corr.shape, generator=gen, dtype=torch.float64)
    return corr if decimals is None else corr.round(decimals=decimals)


def full_rescan_merges(correlation, sizes, within_model, alpha, beta) -> list[tuple[int, int]]:
    """ZipIt! with α and β as the module docstring defines them, every step rebuilding the admissible
    pairs from the clusters and the budgets left and taking the first maximum of the masked linkage in
    row-major order (O(D²) per merge)."""
    n_models, n = len(sizes), sizes[0]
    total = n_models * n
    model = torch.arange(total) // n  # each cluster's representative's model (a cluster keeps its lowest index)
    left = [math.inf if beta is None else math.floor(beta * ((total - n) // n_models) + 1e-9)] * n_models
    members = torch.nn.functional.one_hot(model, n_models).bool()  # (D, N): the models in each cluster
    alive, link, merges = torch.ones(total, dtype=torch.bool), correlation.double().clone(), []
    for _ in range(total - n):
        spent = torch.tensor([b <= 0 for b in left])[model]
        allowed = alive[:, None] & alive[None, :] & ~torch.eye(total, dtype=torch.bool)
        allowed &= ~((model[:, None] == model[None, :]) & spent[:, None])
        if not within_model:
            shared = (members.double() @ members.double().T) > 0
            allowed &= ~shared & (members[:, None, 0] ^ members[None, :, 0])
        i, j = sorted(divmod(int(link.masked_fill(~allowed, -torch.inf).argmax()), total))
        assert allowed[i, j]
        merges.append((i, j))
        if model[i] == model[j]:
            left[int(model[i])] -= 1
        members[i] |= members[j]
        alive[j] = False
        link[i] = link[:, i] = torch.minimum(link[i], link[j]) * alpha
    return merges


@pytest.mark.parametrize("within_model", [True, False])
@pytest.mark.parametrize("n_models", [2, 3, 4])
def test_cached_greedy_equals_the_full_rescan_with_alpha_and_beta(n_models, within_model):
    binding = 0  # cases where the budget changed the merges: the rescan after a spent budget is exercised
    for seed in range(3):
        width = 3 + (4 * seed + n_models) % 10  # widths 3-12
        for decimals, skew in [(None, 0.0), (1, 0.0), (None, 0.3), (1, 0.3)]:
            corr = redundant_correlation(n_models, width, seed, decimals, skew)
            if seed == 2:  # argmax ranks NaN above all; complete linkage spreads it
                corr[torch.rand(corr.shape, generator=torch.Generator().manual_seed(seed)) < 0.03] = torch.nan
            sizes = [width] * n_models
            for alpha in (1.0, 0.7, 0.3):
                free = zip_merges(corr, sizes, within_model, alpha=alpha, beta=None)
                for beta in (None, 0.0, 0.125, 0.5):
                    ours = zip_merges(corr, sizes, within_model, alpha=alpha, beta=beta)
                    assert ours == full_rescan_merges(corr, sizes, within_model, alpha, beta)
                    binding += ours != free
                    if beta == 0.0:
                        assert same_model_merges(ours, sizes) == [0] * n_models
    if within_model:
        assert binding > 20
    else:
        assert binding == 0  # no same-model merge across models: β is moot


def test_plain_full_rescan_is_the_reference_greedy():
    """The full rescan here, at α = 1 and no budget, gives test_cca_zipit's reference clusters."""
    for n_models, within_model in [(2, True), (3, False), (4, True)]:
        corr = redundant_correlation(n_models, 7, n_models, 1, 0.0)
        members = [[k] for k in range(7 * n_models)]
        for i, j in full_rescan_merges(corr, [7] * n_models, within_model, **PLAIN):
            members[i], members[j] = members[i] + members[j], []
        assert sorted(sorted(c) for c in members if c) == _reference_zip_clusters(corr, [7] * n_models, within_model)


def test_bad_alpha_and_beta_are_one_line():
    model, spec, points, params = mlp()
    kwargs = {"model": model, "points": points, "data": data(20)}
    cases = [
        ({"alpha": 0.0}, r"^alpha must be a number in \(0, 1\], got 0\.0$"),
        ({"alpha": 1.5}, r"^alpha must be a number in \(0, 1\], got 1\.5$"),
        ({"alpha": "0.3"}, r"^alpha must be a number in \(0, 1\], got '0\.3'$"),
        ({"beta": -0.1}, r"^beta must be a non-negative number or null, got -0\.1$"),
        ({"beta": math.nan}, r"^beta must be a non-negative number or null, got nan$"),
    ]
    for options, message in cases:
        with pytest.raises(ValueError, match=message) as info:
            zipit(spec, [params, params], **kwargs, **options)
        assert "\n" not in str(info.value)
