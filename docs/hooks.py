"""The docs site's hooks: each reference page's marker replaced by what the code says
(``reference_pages.py`` beside this file), so the reference cannot drift from the schema, the parsers or
the name tables; the notes meant for readers of the Markdown alone dropped; and MathJax
served from the site itself (the ``docs`` extra's copy), so the maths renders offline."""

import re
from importlib import resources
from pathlib import Path

import reference_pages  # beside this file: MkDocs puts a hook's folder on the path while it loads it
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, InclusionLevel

MARKERS = {
    "<!-- rlvr:config-reference -->": reference_pages.config_markdown,
    "<!-- rlvr:cli-reference -->": reference_pages.cli_markdown,
    "<!-- rlvr:trl-names -->": reference_pages.trl_names_markdown,
}
# What a reader of docs/*.md needs and the site does not: where a generated page's content is.
SOURCE_ONLY = re.compile(r"<!-- rlvr:source-only -->.*?<!-- /rlvr:source-only -->\n?", flags=re.S)
# Where mkdocs.yml's extra_javascript finds MathJax in the site.
MATHJAX_URI = "javascripts/mathjax"
# The parts of MathJax's browser build that tex-mml-chtml.js loads from its own folder: TeX
# extensions on demand, the CHTML fonts, the menu and its accessibility tools.
MATHJAX_PARTS = ("tex-mml-chtml.js", "input", "output/chtml", "a11y", "ui", "sre")


def on_page_markdown(markdown, page, config, files):
    for marker, make in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return SOURCE_ONLY.sub("", markdown)


def on_files(files, config):
    root = mathjax_root()
    for part in MATHJAX_PARTS:
        where = root / part
        for path in [where] if where.is_file() else sorted(p for p in where.rglob("*") if p.is_file()):
            uri = f"{MATHJAX_URI}/{path.relative_to(root).as_posix()}"
            files.append(File.generated(config, uri, abs_src_path=str(path), inclusion=InclusionLevel.NOT_IN_NAV))
    # MathJax's licence (Apache 2.0) goes with the copy the site serves
    files.append(File.generated(config, f"{MATHJAX_URI}/LICENSE", abs_src_path=str(root.parent / "LICENSE"),
                                inclusion=InclusionLevel.NOT_IN_NAV))
    return files


def mathjax_root() -> Path:
    """MathJax's browser build (its ``es5/`` folder) as the ``docs`` extra installs it (django-static-mathjax)."""
    try:
        root = Path(str(resources.files("mathjax"))) / "static" / "mathjax" / "es5"
    except ModuleNotFoundError:
        root = None
    if root is None or not (root / "tex-mml-chtml.js").is_file():
        raise PluginError('MathJax is not installed: pip install -e ".[docs]" (django-static-mathjax ships it)')
    return root
