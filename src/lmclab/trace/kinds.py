"""The kinds of a traced spec's groups, once the pass is over: each group no node bent is ``orthogonal`` (or
``centred``, or ``rotary`` for heads that rotary positions turn per plane), with the gains to fold on it
(:mod:`lmclab.trace.rotations` and :mod:`lmclab.trace.planes` have the proof's rules)."""

from __future__ import annotations

from lmclab.core.spec import entry_groups
from lmclab.trace.rotations import RotationRules

RUNS = "it permutes runs of units (whole heads, or a grouped convolution's groups)"
WHOLE = "its heads are a whole nn.MultiheadAttention's, whose products the trace does not see"  # a leaf of torch.fx


class KindRules(RotationRules):
    """The kinds and gains of the spec (:meth:`kinded`), once the pass is over."""

    def kinded(self, axes: dict, identity: dict[str, object]) -> tuple[dict, ...]:
        """For ``symmetry="orthogonal"``: the spec's axes with every gain on an orthogonal group left out of it
        (held at 1), its kinds, gains (:meth:`kinds`), the gains' biases and offsets, and why each other named
        group's kind is narrower (:meth:`reasons`); else ``axes`` as they are, no kinds."""
        if self.symmetry != "orthogonal":
            return axes, {}, {}, {}, {}, {}
        kinds, gains = self.kinds(axes)
        reasons = self.reasons(kinds)
        tied = _tied_keys(identity)
        for gain, readers in gains.items():  # a reader tied to another entry (the head) cannot take the gain alone
            if tied_reader := next((r for r in readers if len(tied.get(r, ())) > 1), None):
                for group in axes[gain]:
                    if kinds.pop(group, None) is not None:
                        reasons[group] = f"gain {gain!r} is read by {tied_reader!r}, one tensor with another entry"
        gains = {g: r for g, r in gains.items() if all(e in kinds for e in axes[g])}
        biases = {g: b for g, b in self.gain_biases.items() if g in gains}
        offsets = {g: c for g, c in self.gain_offsets.items() if g in gains}
        axes = {k: (None,) * len(v) if k in gains else v for k, v in axes.items()}
        return axes, kinds, gains, biases, offsets, reasons

    def kinds(self, axes: dict) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
        """``"orthogonal"`` for every named group no node bent and not read in runs (whole heads, a grouped
        convolution's groups): a headed one inside each head (``"rotary"``: per plane, :attr:`planes`); and the
        gains on those groups with their readers."""
        find = self.groups.find
        bent = {find(g) for g in self.bent} | {find(g) for g in self.groups.coarse}
        bent |= {find(c) for c, _ in self.groups.coarse.values()}  # whole heads (rotary, grouped queries), conv runs
        centred = {find(g) for g in self.centred}
        bent |= {find(g) for g in self.groups.heads if find(g) in centred}  # no centred kind inside heads
        bent |= self.whole_heads()
        planes = {find(g) for g in self.planes}  # turned per plane by rotary positions (lmclab.trace.planes)
        kinds = {
            name: "centred" if root in centred else "rotary" if root in planes else "orthogonal"
            for root, name in self.names.items()
            if root not in bent
        }
        gains, root_of = {}, {name: root for root, name in self.names.items()}
        for gain, readers in self.gains.items():
            entries = axes.get(gain) or ()
            if len(entries) == 1 and entries[0] in kinds and all(r in axes for r in readers):
                gains[gain] = tuple(readers)
                continue
            for name in {g for e in entries for g in entry_groups(e)} & set(kinds):  # a gain left in place
                self.bent.setdefault(root_of[name], f"gain {gain!r} stays in place: only a vector of the units folds")
                kinds.pop(name)
        return kinds, gains

    def whole_heads(self) -> set[int]:
        """The headed groups of every ``nn.MultiheadAttention`` traced whole, bent (:data:`WHOLE`)."""
        find, ties = self.groups.find, {self.groups.find(tie) for tie, _, _ in self.attention_heads.values()}
        whole = {find(g) for g in self.groups.heads if self.groups.tie_of(g) in ties}
        for gid in whole:
            self.bent.setdefault(gid, WHOLE)
        return whole

    def reasons(self, kinds: dict[str, str]) -> dict[str, str]:
        """For each named group that ``kinds`` leaves a permutation group or centres, the first node that keeps
        it so (the proof's order), or else the runs it permutes (heads, a grouped convolution's groups)."""
        find, first = self.groups.find, {}
        for gid, reason in [*self.bent.items(), *self.centred.items(), *self.planes.items()]:
            first.setdefault(find(gid), reason)
        return {name: first.get(root, RUNS) for root, name in self.names.items() if kinds.get(name) != "orthogonal"}


def _tied_keys(identity: dict[str, object]) -> dict[str, tuple[str, ...]]:
    """Each entry with every entry that is the same tensor (an embedding tied to the head; ``identity``:
    :func:`lmclab.trace.state.tensor_identity`)."""
    by_tensor: dict[object, list[str]] = {}
    for key, same in identity.items():
        by_tensor.setdefault(same, []).append(key)
    return {k: tuple(keys) for keys in by_tensor.values() for k in keys}
