"""The house's floors (README, *How the library is built*): a module imports only from its own floor
or those below, the CLI alone is on top, and no modules or folders import each other in a circle.

Imports are read from the source with ``ast``, lazy ones inside functions and ``TYPE_CHECKING`` ones
included: a lazy import up a floor is still a room that needs the one above it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "arag"

# The top-level name under arag (a folder or a module) -> its floor, from the ground up.
FLOORS: dict[str, int] = {
    **dict.fromkeys(["records", "errors", "settings", "version", "text", "http_retry", "cpu"], 0),
    **dict.fromkeys(["models", "index", "ingest"], 1),
    **dict.fromkeys(["corpus", "llm"], 2),
    "retrieval": 3,
    **dict.fromkeys(["agent", "library"], 4),
    # The Python API; the package's __init__ re-exports it lazily.
    **dict.fromkeys(["api", "paper_tools", ""], 5),
    **dict.fromkeys(["service", "mcp_server", "mcp_paper_tools"], 6),
    # The libraries below the CLI.
    **dict.fromkeys(["eval", "train", "bench", "stress"], 7),
    **dict.fromkeys(["cli", "__main__"], 8),
}


def modules(src: Path = SRC, package: str = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, a folder's ``__init__`` named by the folder."""
    out: dict[str, Path] = {}
    for f in sorted((src / package).rglob("*.py")):
        parts = list(f.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def imports(mods: dict[str, Path], package: str = PACKAGE) -> dict[str, set[str]]:
    """Each module's imports of the package's own modules (``from a.b import c`` counts as ``a.b.c``
    when that is a module, else as ``a.b``)."""

    def target(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = m.split(".") if f.name == "__init__.py" else m.split(".")[:-1]
                    base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
                names = [f"{base}.{a.name}" for a in node.names]
            for name in names:
                if name == package or name.startswith(package + "."):
                    t = target(name)
                    if t is not None and t != m:
                        edges[m].add(t)
    return edges


def floor_of(module: str) -> int:
    parts = module.split(".")
    return FLOORS[parts[1] if len(parts) > 1 else ""]


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node, or with a self-loop (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in edges.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def folder_edges(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """Imports between the package's top-level folders and modules (``arag.agent``, ``arag.api``)."""

    def top(m: str) -> str:
        return ".".join(m.split(".")[:2])

    out: dict[str, set[str]] = {}
    for m, targets in edges.items():
        for t in targets:
            if top(t) != top(m) and top(m) != PACKAGE and top(t) != PACKAGE:
                out.setdefault(top(m), set()).add(top(t))
    return out


# --- the checkers on tiny trees, so that a check that can never fail is caught ---------------------


def write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_imports_are_read_lazy_relative_and_type_checking_ones_included(tmp_path: Path) -> None:
    write_tree(
        tmp_path,
        {
            "p/__init__.py": "",
            "p/a/__init__.py": "from .b import x\n",
            "p/a/b.py": "def f():\n    from p.c import y\n",
            "p/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.a import b\n",
        },
    )
    edges = imports(modules(tmp_path, "p"), "p")
    assert edges == {"p": set(), "p.a": {"p.a.b"}, "p.a.b": {"p.c"}, "p.c": {"p.a.b"}}
    assert circles(edges) == [["p.a.b", "p.c"]]


def test_circles_finds_each_component_once() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}, "e": {"a"}}
    assert circles(edges) == [["a", "b", "c"], ["d"]]
    assert circles({"a": {"b"}, "b": set()}) == []


# --- the house itself ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def edges() -> dict[str, set[str]]:
    return imports(modules())


def test_every_top_level_name_has_a_floor() -> None:
    mods = modules()
    assert {"arag", "arag.records", "arag.agent.planner", "arag.cli.main"} <= set(mods)
    tops = {m.split(".")[1] if "." in m else "" for m in mods}
    assert tops - set(FLOORS) == set(), "give the new folder or module a floor in FLOORS and the README"


def test_no_module_imports_a_floor_above_its_own(edges: dict[str, set[str]]) -> None:
    up = [
        f"{m} (floor {floor_of(m)}) imports {t} (floor {floor_of(t)})"
        for m, targets in sorted(edges.items())
        for t in sorted(targets)
        if floor_of(t) > floor_of(m)
    ]
    assert up == []


def test_only_the_cli_imports_the_cli(edges: dict[str, set[str]]) -> None:
    assert [m for m, ts in edges.items() if floor_of(m) < 8 and any(floor_of(t) == 8 for t in ts)] == []


def test_no_import_circle_among_modules_or_folders(edges: dict[str, set[str]]) -> None:
    assert circles(edges) == []
    assert circles(folder_edges(edges)) == []


def test_the_readme_map_names_every_module() -> None:
    """The README's map of modules (*How the library is built*) names every folder and file."""
    readme = (SRC.parent / "README.md").read_text(encoding="utf-8")
    start = readme.index("The modules, by floor")
    section = readme[start : readme.index("\n\n", readme.index("\n- `cli/`", start) + 1)]
    files = [f.relative_to(SRC / PACKAGE) for f in sorted((SRC / PACKAGE).rglob("*.py"))]
    unnamed = [str(f) for f in files if f.name != "__init__.py" and f"{f.name}`" not in section]
    folders = sorted({f.parts[0] for f in files if len(f.parts) > 1})
    assert unnamed == [] and [d for d in folders if f"`{d}/" not in section] == []
