"""Families of layers: a layer's name with its block indices replaced by ``*``, so that ``blocks.*.attn.q.weight``
is the queries of every block (no torch: the report's stages import it)."""

from __future__ import annotations

import re

INDEX = re.compile(r"(?<![^.])\d+(?=\.)")  # a whole dotted component of digits, not the last one


def layer_family(layer: str) -> str:
    """``layer`` with every block index replaced by ``*`` (``blocks.3.fc1.weight`` → ``blocks.*.fc1.weight``)."""
    return INDEX.sub("*", layer)
