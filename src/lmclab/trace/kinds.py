"""The kinds of a traced spec's groups, once the pass is over: each group no node bent is ``orthogonal`` (or
``centred``), with the gains to fold on it (:mod:`lmclab.trace.rotations` has the proof's rules)."""

from __future__ import annotations

from lmclab.trace.rotations import RotationRules


class KindRules(RotationRules):
    """The kinds and gains of the spec (:meth:`kinded`), once the pass is over."""

    def kinded(self, axes: dict, state: dict) -> tuple[dict, dict[str, str], dict[str, tuple[str, ...]], dict, dict]:
        """For ``symmetry="orthogonal"``: the spec's axes with every gain on an orthogonal group left out of it
        (held at 1), its kinds, gains (:meth:`kinds`), the gains' biases and offsets; else ``axes`` as they are,
        no kinds."""
        if self.symmetry != "orthogonal":
            return axes, {}, {}, {}, {}
        kinds, gains = self.kinds(axes)
        tied = _tied_keys(state)
        for gain, readers in gains.items():  # a reader tied to another entry (the head) cannot take the gain alone
            if any(len(tied.get(r, ())) > 1 for r in readers):
                for group in axes[gain]:
                    kinds.pop(group, None)
        gains = {g: r for g, r in gains.items() if all(e in kinds for e in axes[g])}
        biases = {g: b for g, b in self.gain_biases.items() if g in gains}
        offsets = {g: c for g, c in self.gain_offsets.items() if g in gains}
        return {k: (None,) * len(v) if k in gains else v for k, v in axes.items()}, kinds, gains, biases, offsets

    def kinds(self, axes: dict) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
        """``"orthogonal"`` for every named group no node bent, that is neither headed nor read in runs (a
        grouped convolution's); and the gains on those groups with the weights that read them."""
        find = self.groups.find
        bent = {find(g) for g in self.bent} | {find(g) for g in self.groups.coarse}
        bent |= {find(c) for c, _ in self.groups.coarse.values()}  # heads: bent by attention's products
        centred = {find(g) for g in self.centred}
        kinds = {
            name: "centred" if root in centred else "orthogonal"
            for root, name in self.names.items()
            if root not in bent
        }
        gains = {
            gain: tuple(readers)
            for gain, readers in self.gains.items()
            if axes.get(gain) and all(e in kinds for e in axes[gain]) and all(r in axes for r in readers)
        }
        return kinds, gains


def _tied_keys(state: dict) -> dict[str, tuple[str, ...]]:
    """Each entry of ``state`` with every entry that is the same tensor (an embedding tied to the head)."""
    by_tensor: dict[tuple, list[str]] = {}
    for key, value in state.items():
        by_tensor.setdefault((value.data_ptr(), tuple(value.shape)), []).append(key)
    return {k: tuple(keys) for keys in by_tensor.values() for k in keys}
