"""The offline template of `dvc plots show` (tools/offline_plots.py): the vl-convert-python bundle inlined
in one script element, nothing fetched, DVC's placeholders kept. That it draws the plots is
tests/pipeline/test_dvc_interface.py::test_the_plots_page_renders_offline_in_headless_chromium."""

from __future__ import annotations

import re
import sys

import offline_plots
import pytest
import vl_convert
from dvc_repo import ROOT

TEMPLATES = sorted((ROOT / ".dvc" / "plots").glob("*.json"))


def test_the_template_inlines_the_bundle_keeps_dvcs_placeholders_and_loads_nothing(tmp_path):
    line = offline_plots.build(tmp_path / "page.html", TEMPLATES)
    page = (tmp_path / "page.html").read_text()
    assert "{plot_divs}" in page and "{refresh_tag}" in page
    assert "{scripts}" not in page  # DVC's CDN script tags have nowhere to go
    assert re.findall(r"<script\b[^>]*>", page) == ["<script>"] and page.count("</script") == 1
    assert "window.vegaEmbed=" in page and "sourceMappingURL" not in page
    names = f"vega {vl_convert.get_vega_version()}, vega-lite 5."  # the templates' $schema is v5
    assert names in line and f"/* {names}" in page and f"vega-embed {vl_convert.get_vega_embed_version()}" in page


def test_a_bundle_is_escaped_inside_its_script_and_one_with_a_placeholder_is_refused():
    page = offline_plots.page("var a = '</SCRIPT>';\n//# sourceMappingURL=x.js.map\n", "v")
    assert page.count("</script") == 1 and "<\\/SCRIPT>" in page and "x.js.map" not in page
    with pytest.raises(SystemExit, match=r"placeholder \{plot_divs\}"):
        offline_plots.page("var a = '{plot_divs}';", "v")


def test_the_vega_lite_version_is_the_newest_of_the_templates_major():
    assert offline_plots.vegalite_version({"5"}, ["5.8", "5.21", "5.17", "6.4"]) == "5.21"
    with pytest.raises(SystemExit, match=r"majors \['5', '6'\]"):
        offline_plots.vegalite_version({"5", "6"}, ["5.21", "6.4"])
    with pytest.raises(SystemExit, match="none of major 7"):
        offline_plots.vegalite_version({"7"}, ["5.21", "6.4"])


def test_the_major_comes_from_every_templates_schema(tmp_path):
    assert offline_plots.schema_majors(TEMPLATES) == {"5"}
    newer = tmp_path / "newer.json"
    newer.write_text('{"$schema": "https://vega.github.io/schema/vega-lite/v6.json"}')
    assert offline_plots.schema_majors([*TEMPLATES, newer]) == {"5", "6"}
    newer.write_text('{"$schema": "https://vega.github.io/schema/vega/v5.json"}')
    with pytest.raises(SystemExit, match="is no Vega-Lite schema"):
        offline_plots.schema_majors([newer])


def test_without_vl_convert_the_build_says_which_package_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "vl_convert", None)  # import raises ImportError
    with pytest.raises(SystemExit, match="vl-convert-python"):
        offline_plots.build(tmp_path / "page.html", TEMPLATES)
    assert not (tmp_path / "page.html").exists()
