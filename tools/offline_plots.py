"""Build the HTML template that makes `dvc plots show` / `dvc plots diff` pages work offline.

    python tools/offline_plots.py   (run by `make setup`, after `npm ci` in offline/)

DVC's default page loads vega, vega-lite and vega-embed from a CDN. This writes
``.dvc/offline_plots.html`` (named by ``plots.html_template`` in ``.dvc/config``) with the three
libraries inlined from the npm packages pinned in ``offline/package-lock.json``, so the page DVC
writes (``dvc_plots/index.html``) renders with no network and from any output folder. The
template has no ``{scripts}`` placeholder, so DVC's CDN script tags are never added.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARIES = ("vega", "vega-lite", "vega-embed")  # load order: vega-embed needs the other two
PLACEHOLDERS = ("{plot_divs}", "{refresh_tag}", "{scripts}")
PAGE = """<!DOCTYPE html>
<html>
<head>
    {refresh_tag}
    <meta charset="utf-8">
    <title>lmclab plots</title>
    <!-- offline: LIBRARIES inlined by tools/offline_plots.py -->
SCRIPTS
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


def library_script(modules: Path, name: str) -> tuple[str, str]:
    """(version, ``<script>`` element) of one package's minified UMD build."""
    package = modules / name
    if not (package / "package.json").is_file():
        raise SystemExit(f"error: {package}: not installed (run `npm ci` in {modules.parent})")
    version = json.loads((package / "package.json").read_text())["version"]
    code = (package / "build" / f"{name}.min.js").read_text(encoding="utf-8")
    code = re.sub(r"//# sourceMappingURL=\S+\s*$", "", code)  # no request for a .map file
    code = re.sub(r"</(script)", r"<\\/\1", code, flags=re.IGNORECASE)  # cannot end the element early
    for placeholder in PLACEHOLDERS:  # DVC fills these by plain text replacement
        if placeholder in code:
            raise SystemExit(f"error: {name} {version} contains DVC's placeholder {placeholder}")
    return version, f"    <script>/* {name} {version} */\n{code}\n    </script>"


def build(modules: Path, out: Path) -> str:
    """Write the template; return a one-line description."""
    parts = [library_script(modules, name) for name in LIBRARIES]
    versions = ", ".join(f"{name} {version}" for name, (version, _) in zip(LIBRARIES, parts, strict=True))
    page = PAGE.replace("SCRIPTS", "\n".join(script for _, script in parts)).replace("LIBRARIES", versions)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(out)
    return f"{out}: {versions} inlined ({len(page) // 1024} KiB)"


if __name__ == "__main__":
    modules = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "offline" / "node_modules"
    print(build(modules, ROOT / ".dvc" / "offline_plots.html"))
