"""The docs site's hook: each reference page's marker replaced by what the code says
(``rlvr.reference_pages``), so the reference cannot drift from the schema, the parsers or
the name tables."""

from rlvr import reference_pages

MARKERS = {
    "<!-- rlvr:config-reference -->": reference_pages.config_markdown,
    "<!-- rlvr:cli-reference -->": reference_pages.cli_markdown,
    "<!-- rlvr:trl-names -->": reference_pages.trl_names_markdown,
}


def on_page_markdown(markdown, page, config, files):
    for marker, make in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown
