"""The docs site: it builds with ``mkdocs build --strict``, its reference pages are made from
the code, no internal link is broken, the search index exists, headless Chromium renders its
front page and a reference page, and every shell block marked runnable runs as written."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from helpers import chromium

ROOT = Path(__file__).resolve().parents[1]
RUNNABLE = re.compile(r"<!-- runnable -->\n```bash\n(.*?)```", flags=re.S)


def runnable_blocks():
    return [(page.relative_to(ROOT).as_posix(), k, block)
            for page in sorted((ROOT / "docs").rglob("*.md"))
            for k, block in enumerate(RUNNABLE.findall(page.read_text()))]


def test_there_are_runnable_blocks():
    pages = {page for page, _, _ in runnable_blocks()}
    assert {"docs/tutorials/getting-started.md", "docs/how-to/resume.md"} <= pages


@pytest.mark.slow
@pytest.mark.parametrize("page, index, block", runnable_blocks(), ids=lambda v: str(v)[:40])
def test_a_runnable_block_runs_as_written(page, index, block, tmp_path):
    pytest.importorskip("transformers")
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    bin_dir = str(Path(sys.executable).parent)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)})
    assert done.returncode == 0, f"{page} block {index}:\n{done.stderr[-3000:]}"


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("href", "src") and value:
                self.links.append(value)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's notice of its successor, not the site's
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not re.search(r"WARNING\s+-", done.stderr), done.stderr[-3000:]
    return out


def test_the_site_builds_strict_with_its_reference_made_from_the_code(site):
    config_page = (site / "reference" / "config" / "index.html").read_text()
    for key in ("algo.group_size", "algo.kl_coef", "policy.options.model", "cluster.rollout_workers"):
        assert key in config_page
    assert "runs/&lt;name&gt;" in config_page  # help text shown as text, not read as a tag
    assert "rlvr compare" in (site / "reference" / "cli" / "index.html").read_text()
    assert "num_generations" in (site / "reference" / "trl-names" / "index.html").read_text()
    assert "TrainResult" in (site / "reference" / "api" / "index.html").read_text()
    index = site / "search" / "search_index.json"
    assert index.is_file() and index.stat().st_size > 10_000


def test_no_internal_link_is_broken(site):
    broken = []
    for page in site.rglob("*.html"):
        parser = _Links()
        parser.feed(page.read_text())
        for link in parser.links:
            parts = urlparse(link)
            if parts.scheme or parts.netloc or not parts.path:
                continue  # another site, or an anchor on this page
            path = unquote(parts.path)  # the 404 page's links start at the site's root
            target = (site / path.lstrip("/") if path.startswith("/") else page.parent / path).resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{page.relative_to(site)} -> {link}")
    assert not broken, broken[:20]


@pytest.mark.parametrize("path", ["index.html", "reference/config/index.html"])
def test_chromium_renders_the_page(site, path, tmp_path):
    shot = tmp_path / "page.png"
    subprocess.run([*chromium(tmp_path), "--window-size=1280,900", f"--screenshot={shot}", (site / path).as_uri()],
                   capture_output=True, timeout=120)
    assert shot.is_file()
    from matplotlib.image import imread

    pixels = imread(shot)
    assert pixels.shape[:2] == (900, 1280)
    # a rendered page, not a blank one: many distinct colours (text, the header bar, links)
    flat = (pixels[..., :3] * 255).astype(int).reshape(-1, 3)
    assert len({tuple(p) for p in flat[:: 97]}) > 20


def test_the_readme_is_a_front_page_whose_set_up_commands_are_the_getting_started_pages():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    commands = re.findall(r"\n    (pip install torch==2\.13\.0 [^\n]*)\n", readme)
    assert len(commands) == 2 and commands[0].endswith("rlvr train") and commands[1].endswith("python -m pytest -q")
    started = (ROOT / "docs" / "tutorials" / "getting-started.md").read_text()
    assert all(f"\n    {command}\n" in started for command in commands)
    ci = (ROOT / ".ci" / "run").read_text()
    extras = re.search(r'-e "\.\[([a-z,-]+)\]"', commands[1])[1]
    assert f'-e ".[{extras}]"' in ci  # CI installs what the README's test command installs


class _Text(HTMLParser):
    """A page's text as a reader sees it: no scripts, no styles."""

    def __init__(self):
        super().__init__()
        self.hidden, self.parts = 0, []

    def handle_starttag(self, tag, attrs):
        self.hidden += tag in ("script", "style")

    def handle_endtag(self, tag):
        self.hidden -= tag in ("script", "style")

    def handle_data(self, data):
        if not self.hidden:
            self.parts.append(data)


def test_the_maths_renders_with_no_network(site, tmp_path):
    """MathJax is served from the site itself: with every host unreachable, each formula of the
    concepts page is typeset and none is left as TeX source (``\\(\\delta_i\\)``)."""
    page = site / "explanation" / "concepts" / "index.html"
    formulas = page.read_text().count('class="arithmatex"')
    assert formulas > 20
    done = subprocess.run([*chromium(tmp_path), "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=30000",
                           "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    dom = done.stdout
    assert dom.count("<mjx-container") == formulas, done.stderr[-2000:]
    reader = _Text()
    reader.feed(dom)
    text = "".join(reader.parts)
    assert "\\(" not in text and "\\[" not in text and "\\delta" not in text


def test_every_table_column_has_a_header():
    missing = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        lines = page.read_text().splitlines()
        for k, line in enumerate(lines[1:], start=1):
            if re.fullmatch(r"\|( *:?-+:? *\|)+", line.strip()):  # a table's rule: the line above is its header
                if any(not cell.strip() for cell in lines[k - 1].strip().strip("|").split("|")):
                    missing.append(f"{page.relative_to(ROOT)}:{k}: {lines[k - 1]}")
    assert not missing, missing


def test_a_reference_page_read_as_markdown_says_where_its_content_is(site):
    """The reference pages made from the code when the site is built (a marker the hook fills,
    or mkdocstrings' ``:::``): read in docs/, each says so and names the command that prints the
    same; the site has the content, not the note."""
    generated = [page for page in sorted((ROOT / "docs" / "reference").glob("*.md"))
                 if re.search(r"^(<!-- rlvr:[\w-]+ -->|::: )", page.read_text(), flags=re.M)]
    assert {page.stem for page in generated} == {"api", "cli", "config", "trl-names"}
    for page in generated:
        markdown = page.read_text()
        note = re.search(r"<!-- rlvr:source-only -->\n(.*?)<!-- /rlvr:source-only -->", markdown, flags=re.S)
        assert note and "docs site is built" in note[1] and re.search(r"`(rlvr|python) [^`]+`", markdown), page.name
        built = (site / "reference" / page.stem / "index.html").read_text()
        assert "docs site is built" not in built and "rlvr:source-only" not in built, page.name


def test_the_getting_started_dataset_options_point_to_the_reference_that_lists_them(site):
    started = (ROOT / "docs" / "tutorials" / "getting-started.md").read_text()
    assert "src/rlvr/tasks" not in started
    paragraph = started[started.index("The file may be JSONL"):]
    paragraph = paragraph[:paragraph.index("\n\n")]
    assert "(../reference/config.md#taskname-dataset)" in paragraph
    reference = (site / "reference" / "config" / "index.html").read_text()
    section = reference[reference.index('id="taskname-dataset"'):]
    section = section[:section.index("<h3")]
    options = paragraph[paragraph.index("(`task.options`:"):paragraph.index("[configuration reference]")]
    named = re.findall(r"`(\w+)(?::[^`]*)?`", options)
    assert len(named) >= 8
    assert [option for option in named if f"<code>{option}</code>" not in section] == []


@pytest.mark.slow
def test_the_readme_tour_names_the_files_its_lecture_commands_write(tmp_path, monkeypatch):
    """One epoch each, in an empty directory: every file the tour names for them is written."""
    from rlvr.cli import main

    readme = (ROOT / "README.md").read_text()
    tour = re.search(r"\*\*The lecture's run\*\*(.*?):\n\n((?:    rlvr [^\n]*\n)+)", readme, flags=re.S)
    files = re.findall(r"`([\w/.-]+\.png)`", tour[1])
    commands = [shlex.split(line) for line in tour[2].splitlines()]
    assert len(files) == 2 and [c[:2] for c in commands] == [["rlvr", "train"], ["rlvr", "compare"]]
    monkeypatch.chdir(tmp_path)
    for command in commands:
        assert main([*command[1:], "algo.epochs=1"]) == 0
    assert [f for f in files if not (tmp_path / f).is_file()] == []


def test_the_layout_pages_floors_are_the_import_graphs():
    """Each row of the layout page's table (floor, package, what it imports) is what the code's
    imports say, read as ``tests/test_layers.py`` reads them, package by package."""
    from test_layers import graph, package

    imports: dict[str, set[str]] = {}
    for a, deps in graph().items():
        imports.setdefault(package(a), set()).update(package(b) for b in deps if package(b) != package(a))
    floors: dict[str, int] = {}

    def floor(name: str) -> int:
        if name not in floors:
            floors[name] = 1 + max((floor(b) for b in imports[name]), default=-1)
        return floors[name]

    def label(name: str) -> str:  # the table's name: `core/`, `api.py`, `__init__.py`
        short = name.removeprefix("rlvr").lstrip(".") or "__init__"
        return f"`{short}/`" if (ROOT / "src" / name.replace(".", "/")).is_dir() and short != "__init__" \
            else f"`{short}.py`"

    def named(name: str) -> str:
        return name.removeprefix("rlvr.") if name != "rlvr" else "rlvr"

    code = sorted(f"| {floor(name)} | {label(name)} | "
                  + (", ".join(f"`{named(b)}`" for b in sorted(imports[name], key=named)) or "(nothing of rlvr)")
                  for name in imports)
    page = (ROOT / "docs" / "explanation" / "layout.md").read_text()
    rows = re.findall(r"^\| (\d+) \| (`[\w/.]+`) \| [^|]+ \| ([^|]+) \|$", page, flags=re.M)
    table = sorted(f"| {f} | {name} | {deps.strip()}" for f, name, deps in rows)
    assert table == code, "the layout page's table should read:\n" + "\n".join(code)


def test_every_long_stretch_of_a_page_has_a_heading():
    """A reader scans a page by its headings: no page runs on for more than 150 lines (code
    blocks included) without one."""
    long = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        run, fence = 0, False
        for line in page.read_text().splitlines():
            fence ^= line.startswith("```")
            run = 0 if not fence and re.match(r"#{1,6} ", line) else run + 1
            if run > 150:
                long.append(page.relative_to(ROOT).as_posix())
                break
    assert not long, long
