"""Build the HTML template that makes `dvc plots show` / `dvc plots diff` pages work offline.

    python tools/offline_plots.py   (run by `make setup`)

DVC's default page loads vega, vega-lite and vega-embed from a CDN. This writes
``.dvc/offline_plots.html`` (named by ``plots.html_template`` in ``.dvc/config``) with the three
libraries inlined from the JavaScript bundle that the PyPI package ``vl-convert-python`` ships
(``vl_convert.javascript_bundle``; pinned in ``requirements.lock``, no Node.js, no network), so the
page DVC writes (``dvc_plots/index.html``) renders with no network and from any output folder. The
template has no ``{scripts}`` placeholder, so DVC's CDN script tags are never added. The Vega-Lite
version is the newest the package bundles of the major named by the ``$schema`` of the plot
templates (``.dvc/plots/*.json`` and DVC's built-in ones).
"""

from __future__ import annotations

import json
import re
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLACEHOLDERS = ("{plot_divs}", "{refresh_tag}", "{scripts}")  # DVC fills these by plain text replacement
SCHEMA = re.compile(r"vega-lite/v(\d+)(?:\.\d+)*\.json$")
PAGE = """<!DOCTYPE html>
<html>
<head>
    {refresh_tag}
    <meta charset="utf-8">
    <title>lmclab plots</title>
    <!-- offline: VERSIONS inlined by tools/offline_plots.py -->
SCRIPT
    <style>
        body { font-family: sans-serif; }
        table { border-spacing: 15px; }
    </style>
</head>
<body>
    {plot_divs}
</body>
</html>
"""


def schema_majors(templates: list[Path]) -> set[str]:
    """The Vega-Lite major versions named by the ``$schema`` of DVC's and these plot templates."""
    from dvc_render.vega_templates import TEMPLATES

    schemas = [t.DEFAULT_CONTENT["$schema"] for t in TEMPLATES]
    schemas += [json.loads(path.read_text())["$schema"] for path in templates]
    majors = set()
    for schema in schemas:
        if not (match := SCHEMA.search(schema)):
            raise SystemExit(f"error: plot template $schema {schema!r} is no Vega-Lite schema")
        majors.add(match.group(1))
    return majors


def vegalite_version(majors: set[str], available: list[str]) -> str:
    """The newest of ``available`` (e.g. ``["5.21", "6.4"]``) whose major is the one in ``majors``."""
    if len(majors) != 1:
        raise SystemExit(f"error: plot templates name Vega-Lite majors {sorted(majors)}; the page bundles one")
    (major,) = majors
    fitting = [v for v in available if v.split(".")[0] == major]
    if not fitting:
        raise SystemExit(f"error: vl-convert-python bundles Vega-Lite {available}, none of major {major}")
    return max(fitting, key=lambda v: tuple(int(part) for part in v.split(".")))


def page(bundle: str, versions: str) -> str:
    """The template: ``bundle`` (JavaScript defining ``window.vegaEmbed``) inlined in one ``<script>``."""
    bundle = re.sub(r"//# sourceMappingURL=\S+\s*$", "", bundle)  # no request for a .map file
    bundle = re.sub(r"</(script)", r"<\\/\1", bundle, flags=re.IGNORECASE)  # cannot end the element early
    for placeholder in PLACEHOLDERS:
        if placeholder in bundle:
            raise SystemExit(f"error: the bundle ({versions}) contains DVC's placeholder {placeholder}")
    # a function scope: the bundle's top-level names cannot clash with the `var spec` of DVC's plot divs
    script = f"    <script>/* {versions} */\n(function () {{\n{bundle}\n}})();\n    </script>"
    return PAGE.replace("SCRIPT", script).replace("VERSIONS", versions)


def build(out: Path, templates: list[Path]) -> str:
    """Write the template to ``out``; return a one-line description."""
    try:
        import vl_convert
    except ImportError:
        raise SystemExit("error: vl_convert: not installed (`make setup` installs vl-convert-python)") from None
    lite = vegalite_version(schema_majors(templates), vl_convert.get_vegalite_versions())
    versions = (
        f"vega {vl_convert.get_vega_version()}, vega-lite {lite}, vega-embed {vl_convert.get_vega_embed_version()}"
        f" (vl-convert-python {version('vl-convert-python')})"
    )
    text = page(vl_convert.javascript_bundle(vl_version=lite), versions)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)
    return f"{out}: {versions} inlined ({len(text) // 1024} KiB)"


if __name__ == "__main__":
    print(build(ROOT / ".dvc" / "offline_plots.html", sorted((ROOT / ".dvc" / "plots").glob("*.json"))))
