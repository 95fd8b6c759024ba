"""The docs agree with the code and with each other: what the code defines (its error ids, its measured
figures' JSON) and what one page says another already says are read from their source, not copied."""

from __future__ import annotations

import ast
import inspect
import io
import json
import re
import tokenize
from pathlib import Path

import qbroker.errors as errors

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PYTHON_BLOCK = re.compile(r"```python\n(?P<body>.*?)\n```", re.S)


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _unquote(cell: str) -> str:
    return cell[1:-1] if len(cell) >= 2 and cell[0] == cell[-1] == "`" else cell


def _table_after(text: str, marker: str) -> list[list[str]]:
    """The rows (cells) of the first Markdown table after ``marker``, header and rule left out."""
    lines = text[text.index(marker) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(_cells(line))
    return rows


# -- docs/wire-format.md: every error id the library defines ----------------------------------------------------


def _library_error_classes() -> list[type[errors.QBrokerError]]:
    return [
        cls
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.QBrokerError) and cls.__module__ == errors.__name__
    ]


def test_every_error_id_the_library_defines_is_in_the_wire_format() -> None:
    """Each id of qbroker's own (its error classes, ``LIBRARY_ERROR_IDS``) is a row of wire-format.md's table
    of the triples qbroker produces, with the class's status and fixed message, or is named among the ids
    raised on the caller's side only (or a base class's own). An id added to the code without a row fails here."""
    text = (DOCS / "wire-format.md").read_text(encoding="utf-8")
    table = {
        (row[0], _unquote(row[1])): _unquote(row[3])
        for row in _table_after(text, "Every triple qbroker itself produces")
    }
    # the paragraph after the table: ids raised on the caller's side only, and the base classes' own
    outside = text[text.index("Raised on the caller's side only") :]
    named_outside = set(re.findall(r"`(?:fail|error)`/`([a-z_]+)`", outside[: outside.index("\n\n")]))
    assert table and named_outside, "wire-format.md: the table or the caller-side list moved"
    problems = []
    for cls in _library_error_classes():
        key, fixed = (cls.status, cls.error_id), cls.summary
        if key in table:
            if fixed is not None and table[key] != fixed:
                problems.append(f"{cls.__name__}: row says {table[key]!r}, the code sends {fixed!r}")
        elif cls.error_id not in named_outside:
            problems.append(f"{cls.__name__}: no row {cls.status} | `{cls.error_id}`")
    listed = {error_id for _, error_id in table} | named_outside
    problems += [
        f"library id {i!r}: neither in the table nor among the caller-side ids"
        for i in sorted(errors.LIBRARY_ERROR_IDS - listed)
    ]
    assert not problems, "\n".join(problems)


# -- examples: one message per (status, id, part) -----------------------------------------------------------------


def _doc_python_blocks() -> list[tuple[str, str]]:
    found = []
    for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        for match in PYTHON_BLOCK.finditer(text):
            found.append((f"{page.name}:{text[: match.start()].count(chr(10)) + 1}", match["body"]))
    return found


def _message_argument(call: ast.Call) -> ast.expr | None:
    name = call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", None)
    position = {"RequestFailed": 1, "RequestError": 1, "Warn": 2}.get(str(name))
    if position is None:
        return None
    if len(call.args) > position:
        return call.args[position]
    return next((k.value for k in call.keywords if k.arg == "message"), None)


def test_the_docs_examples_keep_each_error_message_fixed() -> None:
    """wire-format.md: a (status, id, part) triple always carries the same message, the specifics go in
    ``detail``. The README's and docs' examples are what readers copy: none builds its message per request."""
    blocks = _doc_python_blocks()
    parsed, problems = 0, []
    for where, body in blocks:
        try:
            tree = ast.parse(body)
        except SyntaxError:  # a fragment (a signature, an elided body): nothing to run, nothing to copy whole
            continue
        parsed += 1
        for node in ast.walk(tree):
            message = _message_argument(node) if isinstance(node, ast.Call) else None
            if message is not None and not (isinstance(message, ast.Constant) and isinstance(message.value, str)):
                problems.append(f"{where}: {ast.unparse(node)}")
    assert parsed >= 10 and any(where.startswith("README.md") for where, _ in blocks)
    assert not problems, "messages built per request (put the specifics in detail=):\n" + "\n".join(problems)


# -- docs/semantics.md: each seed feature mapped once ---------------------------------------------------------


def test_each_seed_feature_is_mapped_in_one_row() -> None:
    """The mapping table names each seed feature (a backquoted RQ or EventMQ word in the first column) in one
    row only: two rows for one feature say two different things about it."""
    rows = _table_after((DOCS / "semantics.md").read_text(encoding="utf-8"), "| seed feature | qbroker |")
    seen: dict[str, int] = {}
    doubles = []
    for number, row in enumerate(rows):
        for feature in set(re.findall(r"`([^`]+)`", row[0])):
            if feature in seen:
                doubles.append(f"{feature}: rows {seen[feature] + 1} and {number + 1}")
            seen.setdefault(feature, number)
    assert len(rows) > 10 and not doubles, doubles


# -- docs/scaling.md: the render figure is the final bench's ----------------------------------------------------


def test_the_scaling_render_figure_is_the_one_its_bench_json_measured() -> None:
    """scaling.md's "render one metatile" row names the bench JSON it comes from; the figure its arithmetic
    extrapolates with (``RENDER_SECONDS``) and the Renderers table are within the medians measured there."""
    text = (DOCS / "scaling.md").read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| render one metatile"))
    sources = re.findall(r"`(docs/bench/[^`]+\.json)`", row)
    assert sources, "the render row names no docs/bench JSON"
    medians = [
        float(run["median_seconds"])
        for source in sources
        for run in json.loads((ROOT / source).read_text())["render"].values()
        if isinstance(run, dict)
    ]
    assert medians
    constant = float(re.search(r"^RENDER_SECONDS = ([0-9.]+)", text, re.M).group(1))  # type: ignore[union-attr]
    assert round(min(medians), 3) <= constant <= round(max(medians), 3), (constant, min(medians), max(medians))
    assert f"(x {constant} s)" in text and f"x {constant} s / 60 s" in text  # the Renderers table and its sum
    low, high = re.search(r"\*\*([0-9.]+)-([0-9.]+) s\*\*", row).groups()  # type: ignore[union-attr]
    assert (float(low), float(high)) == (round(min(medians), 3), round(max(medians), 3))


# -- docs/performance.md: which import figure stands -------------------------------------------------------------

IMPORT_RATE = re.compile(r"[\d,.]+k? objects/s")
GOAL_2 = "> Goal 2 (the import's rate): "


def test_each_import_measurement_says_which_figure_stands() -> None:
    """Sections of performance.md measured different code, and their goal-2 verdicts ("not met", "met") were
    true of that code only: each section quoting an import rate starts with a line saying what it measured and
    pointing at the section that says which figure stands; exactly one section holds that figure."""
    text = (DOCS / "performance.md").read_text(encoding="utf-8")
    sections = {part.splitlines()[0]: part for part in re.split(r"(?m)^## ", text)[1:]}
    summary = [title for title in sections if title.startswith("The import's rate")]
    assert len(summary) == 1, summary
    problems, standing = [], []
    for title, body in sections.items():
        if title in summary or not IMPORT_RATE.search(body):
            continue
        marks = [line for line in body.splitlines() if line.startswith(GOAL_2)]
        if len(marks) != 1:
            problems.append(f"{title[:70]}: {len(marks)} lines starting {GOAL_2!r}")
        elif "is the figure that stands" in marks[0]:
            standing.append(title)
        elif f'"{summary[0]}"' not in marks[0]:
            problems.append(f"{title[:70]}: its mark does not point at the summary section")
    assert not problems, "\n".join(problems)
    assert len(standing) == 1, standing
    assert standing[0].split(" (")[0].split(",")[0] in sections[summary[0]], "the summary names another section"


# -- the code's comments: self-contained, pointing into docs/ ------------------------------------------------------

CODE_DIRS = ("qbroker", "services", "bench", "harness", "demo")
ISSUE_NUMBER = re.compile(r"\bissues? #?\d+", re.I)
OUTSIDE_PATH = re.compile(r"\.\./shared\b|\bshared/seeds\b|\bseeds/")
# "the seed" was the protocols' original text, outside the repository: comments state the rule and point to
# docs/ instead. RNG seeds ("seeded", "a fixed seed") and identifiers (seed_wire, floor_seed) are not meant.
SEED_REFERENCE = re.compile(
    r"\bthe seed\b|\bseed's|\bseed[- ](?:wire|program|client|command|field|thread|"
    r"structure)|\bseed-structured|\b(?:TopOSM|QBroker) seed\b",
    re.I,
)
# The one place a path outside the repository stays: the harness locating the peer program it runs.
OUTSIDE_PATH_ALLOWED = {"harness/original_qbroker.py": 1}
DOC_POINTER = re.compile(r"docs/([\w-]+\.md),?\s+\"([^\"]+)\"")


def _code_files() -> list[Path]:
    return sorted(path for folder in CODE_DIRS for path in (ROOT / folder).rglob("*.py"))


def _prose(path: Path) -> str:
    """A module's comments and docstrings, whitespace collapsed: what it says to a reader, not what it runs."""
    source = path.read_text(encoding="utf-8")
    parts = [
        token.string.lstrip("#")
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring:
                parts.append(docstring)
    return " ".join(" ".join(part.split()) for part in parts)


def test_code_names_no_issue_numbers_and_no_paths_outside_the_repository() -> None:
    """No issue numbers in the code or the tests (the why goes in the comment, the figure in
    docs/performance.md), and nothing points outside the repository (``../shared``, ``seeds/``) but the harness
    finding its peer."""
    problems = []
    for path in [*_code_files(), *sorted((ROOT / "tests").rglob("*.py"))]:
        name, text = path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8")
        problems += [f"{name}: {match}" for match in ISSUE_NUMBER.findall(text)]
        outside = OUTSIDE_PATH.findall(text) if path != Path(__file__).resolve() else []  # not the rule's own text
        if len(outside) > OUTSIDE_PATH_ALLOWED.get(name, 0):
            problems.append(f"{name}: {len(outside)} paths outside the repository ({', '.join(outside)})")
    assert not problems, "\n".join(problems)


def test_comments_state_the_protocols_rules_not_the_seed() -> None:
    """Comments and docstrings say what the protocol requires and point to docs/wire-format.md, docs/tiles.md
    ("The TopOSM protocol") or docs/semantics.md, never to "the seed", a text outside the repository."""
    problems = []
    for path in _code_files():
        for match in SEED_REFERENCE.finditer(prose := _prose(path)):
            around = prose[max(0, match.start() - 40) : match.end() + 40]
            problems.append(f"{path.relative_to(ROOT).as_posix()}: ...{around}...")
    assert not problems, "\n".join(problems)


def test_comments_point_to_doc_sections_that_exist() -> None:
    """A comment's ``docs/<page>.md, "<section>"`` names a page of docs/ and a heading of it: a renamed section
    fails here instead of leaving the code pointing nowhere."""
    headings = {
        page.name: [
            " ".join(line.lstrip("#").split())
            for line in page.read_text(encoding="utf-8").splitlines()
            if line.startswith("#")
        ]
        for page in DOCS.glob("*.md")
    }
    problems, pointers = [], 0
    for path in _code_files():
        for page, section in DOC_POINTER.findall(_prose(path)):
            pointers += 1
            if not any(section in heading for heading in headings.get(page, [])):
                problems.append(f"{path.relative_to(ROOT).as_posix()}: docs/{page}, {section!r}")
    assert pointers >= 20 and not problems, "\n".join(problems)


# -- docs/tiles.md: the module tree is the tree --------------------------------------------------------------------


def test_the_tiles_module_tree_lists_every_module() -> None:
    """docs/tiles.md draws services/toposm and the three tile programs' packages: every module in them is named
    there (a module added, moved or renamed without the tree fails here), and every name there exists."""
    text = (DOCS / "tiles.md").read_text(encoding="utf-8")
    tree = text[text.index("## Layout: services/toposm and services/tiles") :]
    tree = tree[tree.index("```text") : tree.index("```\n", tree.index("```text") + 7)]
    named = set(re.findall(r"([\w]+\.py)\b", tree))
    folders = [
        ROOT / "services" / "toposm",
        *(ROOT / "services" / "tiles" / program for program in ("queuemaster", "renderer", "render_list")),
    ]
    modules = {path.name for folder in folders for path in folder.glob("*.py") if path.name != "__init__.py"}
    assert not modules - named, f"modules missing from docs/tiles.md's tree: {sorted(modules - named)}"
    assert not named - modules, f"docs/tiles.md's tree names modules that do not exist: {sorted(named - modules)}"
