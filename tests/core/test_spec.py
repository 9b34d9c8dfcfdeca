"""PermutationSpec and apply_permutation, parametrised over the architecture registry."""

from __future__ import annotations

import pytest
import torch
from conftest import SMALL_CONFIGS, random_params
from torch.func import functional_call

from lmclab.archs import build_model, get_arch, make_config
from lmclab.core.spec import (
    PermutationSpec,
    apply_permutation,
    build_spec,
    check_permutation,
    compose,
    identity_permutation,
    invert,
    random_permutation,
)
from lmclab.core.spec_builders import dense

INPUTS = {"mlp": (1, 28, 28)}


def _setup(arch: str):
    shape = INPUTS.get(arch, (3, 32, 32))
    config = make_config(arch, input_shape=shape, num_classes=10, **SMALL_CONFIGS[arch])
    return config, get_arch(arch).permutation_spec(config), random_params(arch, config, seed=0), shape


@pytest.mark.parametrize("arch", sorted(SMALL_CONFIGS))  # float32 at 1e-5; all archs: test_every_arch
def test_spec_keys_equal_state_dict_keys(arch: str) -> None:
    config, spec, params, _ = _setup(arch)
    assert set(spec.axes) == set(params)
    spec.check(params)
    for name, axes in spec.axes.items():
        assert len(axes) == params[name].dim(), name


@pytest.mark.parametrize("arch", sorted(SMALL_CONFIGS))  # float32 at 1e-5; all archs: test_every_arch
def test_random_permutation_leaves_logits_unchanged(arch: str) -> None:
    config, spec, params, shape = _setup(arch)
    model = build_model(arch, config).eval()
    perm = random_permutation(spec.group_sizes(params), torch.Generator().manual_seed(1))
    assert any(not torch.equal(p, torch.arange(len(p))) for p in perm.values())
    x = torch.randn(8, *shape, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = functional_call(model, params, (x,))
        after = functional_call(model, apply_permutation(spec, perm, params), (x,))
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)
    permuted = apply_permutation(spec, perm, params)
    assert any(not torch.equal(permuted[k], params[k]) for k in params)


@pytest.mark.parametrize("arch", sorted(SMALL_CONFIGS))  # float32 at 1e-5; all archs: test_every_arch
def test_permutation_then_inverse_is_identity(arch: str) -> None:
    _, spec, params, _ = _setup(arch)
    perm = random_permutation(spec.group_sizes(params), torch.Generator().manual_seed(3))
    back = apply_permutation(spec, invert(perm), apply_permutation(spec, perm, params))
    for k in params:
        assert torch.equal(back[k], params[k]), k
    ident = compose(invert(perm), perm)
    assert all(torch.equal(p, torch.arange(len(p))) for p in ident.values())


def test_compose_matches_sequential_application() -> None:
    spec = build_spec(dense("l0", "P", None), dense("l1", None, "P"))
    params = {
        "l0.weight": torch.randn(5, 3),
        "l0.bias": torch.randn(5),
        "l1.weight": torch.randn(2, 5),
        "l1.bias": torch.randn(2),
    }
    g = torch.Generator().manual_seed(0)
    p1, p2 = random_permutation({"P": 5}, g), random_permutation({"P": 5}, g)
    twice = apply_permutation(spec, p2, apply_permutation(spec, p1, params))
    once = apply_permutation(spec, compose(p2, p1), params)
    assert all(torch.equal(twice[k], once[k]) for k in params)


def test_spec_errors_are_one_line() -> None:
    spec = build_spec(dense("l0", "P", None), dense("l1", None, "P"))
    good = {
        "l0.weight": torch.zeros(4, 3),
        "l0.bias": torch.zeros(4),
        "l1.weight": torch.zeros(2, 4),
        "l1.bias": torch.zeros(2),
    }
    with pytest.raises(ValueError, match="keys do not match"):
        spec.check({k: v for k, v in good.items() if k != "l1.bias"})
    with pytest.raises(ValueError, match="group 'P'"):
        spec.check({**good, "l1.weight": torch.zeros(2, 5)})
    with pytest.raises(ValueError, match="twice"):
        build_spec(dense("l0", "P", None), dense("l0", "P", None))
    with pytest.raises(ValueError, match="not a bijection"):
        check_permutation({"P": torch.tensor([0, 0, 1, 2])}, {"P": 4})
    check_permutation(identity_permutation({"P": 4}), {"P": 4})


def test_groups_inverse_view_and_stats() -> None:
    spec = PermutationSpec(
        axes={"a.weight": ("P", None), "a.running_mean": ("P",), "b.weight": (None, "P")},
        stats=frozenset({"a.running_mean"}),
    )
    assert spec.groups == {"P": [("a.weight", 0), ("a.running_mean", 0), ("b.weight", 1)]}
    assert set(spec.matched({"a.weight": 1, "a.running_mean": 2, "b.weight": 3})) == {"a.weight", "b.weight"}


def test_a_permuted_state_dict_keeps_the_module_versions_load_state_dict_reads():
    """torchvision's MNASNet refuses a state dict without its version metadata: the permuted one (core and
    API alike) carries the original's, so it loads; a plain dict stays a plain dict."""
    import torchvision

    import lmclab
    from lmclab.trace import trace_spec

    a, b = torchvision.models.mnasnet0_5(num_classes=10).eval(), torchvision.models.mnasnet0_5(num_classes=10).eval()
    spec, state = trace_spec(a, torch.zeros(2, 3, 32, 32)), a.state_dict()
    perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(0))
    a.load_state_dict(apply_permutation(spec, perm, state))
    b.load_state_dict(lmclab.find_permutation(a, b, spec=spec).apply(b))
    assert not hasattr(apply_permutation(spec, perm, dict(state)), "_metadata")
