"""Weight matching's planted-copy start (``is_relabelling``: θb holds θa's values in another order) on a
state dict that also holds tensors that are not floating point, as Hugging Face models carry their integer
``position_ids``: such an entry has no values to compare and is passed over."""

from __future__ import annotations

import torch
from torch import nn

from lmclab.core.spec import apply_permutation, invert, random_permutation
from lmclab.search.weight_matching import is_relabelling, weight_matching
from lmclab.trace import trace_spec


class Positioned(nn.Module):
    """An MLP on 4 features that adds an integer buffer of 4 positions to its input."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("position_ids", torch.arange(4))
        self.fc, self.out = nn.Linear(4, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.fc(x + self.position_ids)))


def test_a_permuted_copy_with_an_integer_buffer_is_a_relabelling_and_matched_from_it() -> None:
    torch.manual_seed(0)
    net = Positioned()
    spec, params_a = trace_spec(net, torch.randn(2, 4)), net.state_dict()
    assert "position_ids" in spec.matched(params_a) and params_a["position_ids"].dtype == torch.int64
    perm = random_permutation(spec.group_sizes(params_a), torch.Generator().manual_seed(1))
    params_b = apply_permutation(spec, perm, params_a)
    assert is_relabelling(spec, params_a, params_b)
    found = weight_matching(spec, params_a, params_b)
    assert found.stats["first_start"] == "sorted signatures"
    assert all(torch.equal(found.perm[g], p) for g, p in invert(perm).items())
    other = {**params_b, "fc.bias": params_b["fc.bias"] + 1}
    assert not is_relabelling(spec, params_a, other)
