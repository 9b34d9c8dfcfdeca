"""The tracer's shared state (src/lmclab/trace/state.py): its invariants hold before and after naming the
groups, on every architecture of the registry's kinds (layers, convolutions, residual streams, grouped
convolutions, attention with packed, grouped-query and rotary heads) and on a partial trace; and
``check`` fails on a state that breaks one."""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import fx, nn

from lmclab.archs import build_model, make_config
from lmclab.trace import _propagate, trace
from lmclab.trace.graph import GraphTracer
from lmclab.trace.groups import Seg, Tag

ARCHS = [
    ("mlp", {"hidden": 3, "width": 16}, (1, 28, 28)),
    ("vgg", {"width_multiplier": 0.125}, (3, 32, 32)),
    ("resnet20", {"width_multiplier": 1}, (3, 32, 32)),
    ("mixer", {"patch_size": 7, "hidden": 16, "token_mlp": 8, "channel_mlp": 24, "depth": 2}, (1, 28, 28)),
    ("vit", {"patch_size": 7, "width": 16, "depth": 2, "heads": 4}, (1, 28, 28)),
    ("gpt", {"width": 8, "depth": 2, "heads": 2}, (8,)),
    ("gpt", {"width": 16, "depth": 1, "heads": 4, "kv_heads": 2, "position": "rotary"}, (8,)),
]


@pytest.fixture
def checked(monkeypatch) -> list[GraphTracer]:
    """Every tracer that names its groups, checked before and after."""
    seen, result = [], GraphTracer.result

    def checking(self: GraphTracer, model: nn.Module):
        self.check()
        out = result(self, model)
        self.check()
        seen.append(self)
        return out

    monkeypatch.setattr(GraphTracer, "result", checking)
    return seen


@pytest.mark.parametrize("arch,options,shape", ARCHS, ids=[f"{a}-{i}" for i, (a, _, _) in enumerate(ARCHS)])
def test_the_state_keeps_its_invariants_on_every_kind_of_architecture(checked, arch, options, shape) -> None:
    config = make_config(arch, input_shape=shape, num_classes=10, **options)
    x = torch.zeros(2, *shape, dtype=torch.long) if arch == "gpt" else torch.zeros(2, *shape)
    trace(build_model(arch, config), x)
    assert len(checked) == 1 and checked[0].names and checked[0].tags


@pytest.mark.parametrize("name", ["mobilenet_v2", "shufflenet_v2_x0_5"])
def test_the_state_keeps_its_invariants_through_grouped_convolutions_and_partial_traces(checked, name) -> None:
    model = getattr(torchvision.models, name)(weights=None, num_classes=10).eval()
    trace(model, torch.zeros(1, 3, 32, 32), partial=True)  # shufflenet's channel shuffle: pinned
    assert len(checked) == 1


def _tracer() -> GraphTracer:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    gm = fx.symbolic_trace(model)
    _propagate(gm, model, (torch.zeros(2, 4),))
    tracer = GraphTracer(gm, partial=False)
    tracer.run()
    tracer.check()
    return tracer


@pytest.mark.parametrize(
    "breaks",
    [
        lambda t: t.tags.__setitem__(fx.Graph().placeholder("x"), None),  # a node of another graph
        lambda t: t.tags.__setitem__(list(t.tags)[-2], Tag.of([None, (Seg(0, 3),)])),  # 3 units of 4
        lambda t: t.tags.__setitem__(list(t.tags)[-2], Tag.of([(Seg(0, 2),)])),  # 1 layout, 2 axes
        lambda t: t.writers.__setitem__(99, [("layer", "0")]),  # a group the union-find never made
        lambda t: t.tags.__setitem__(next(iter(t.tags)), Tag.of([(Seg(98, 4),)])),
        lambda t: t.names.update({t.groups.new(): "P_0", t.groups.new(): "P_0"}),  # one name, two groups
        lambda t: t.names.update({t.groups.union(t.groups.new(), t.groups.new()) + 1: "P_9"}),  # the joined child
    ],
    ids=[
        "foreign-node",
        "short-layout",
        "missing-axis",
        "unknown-writer",
        "unknown-group",
        "one-name-twice",
        "name-of-a-non-root",
    ],
)
def test_check_fails_on_a_state_that_breaks_an_invariant(breaks) -> None:
    tracer = _tracer()
    breaks(tracer)
    with pytest.raises(AssertionError):
        tracer.check()


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_a_model_built_on_the_meta_device_traces_to_the_spec_of_its_weighted_twin(tied: bool) -> None:
    """A model without weights (the ``meta`` device, where every tensor's address is 0) is traced as its twin with
    weights: ties are told by the parameter objects, so same-shaped weights are not taken for one tensor, and a
    head tied to the embeddings still is (both symmetries: the kinds read the ties too)."""
    from lmclab.archs import build_model, make_config
    from lmclab.trace import trace

    config = make_config("gpt", input_shape=[8], num_classes=40, width=16, heads=2, depth=2, tie_embeddings=tied)
    real = build_model("gpt", config, seed=0).eval()
    with torch.device("meta"):
        meta = build_model("gpt", config, seed=0).eval()
    tokens = torch.zeros(2, 8, dtype=torch.long)
    for symmetry in ("permutation", "orthogonal"):
        expected = trace(real, tokens, symmetry=symmetry).spec
        assert trace(meta, tokens.to("meta"), symmetry=symmetry).spec == expected
        assert expected.kinds or symmetry == "permutation"
