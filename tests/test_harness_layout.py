"""The harness laid out by process, read from its folders: ``parent/`` (the judging process),
``reference/`` (the clean reference worker), ``child/`` (the candidate's process), and beside
them, at ``harness/``, the modules more than one of them loads.

Rules: a process's folder imports only its own folder and the shared modules; the shared modules
import no process's folder; the parent names the workers only where it starts them (the sandbox's
child targets); a shared module is loaded by at least two processes and a folder's module by its
own process only; no import cycles."""

from __future__ import annotations

import ast
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[1] / "src" / "cudal1" / "harness"
FOLDERS = ("parent", "reference", "child")
ENTRIES = {"reference": "cudal1.harness.reference.worker", "child": "cudal1.harness.child.worker"}
STARTER = "cudal1.harness.parent.sandbox"  # starts both workers: its child targets import their entry points


def _module(path: Path) -> str:
    parts = path.relative_to(HARNESS).with_suffix("").parts
    return ".".join(("cudal1", "harness") + tuple(p for p in parts if p != "__init__"))


def _imports(path: Path) -> set[str]:
    """Every cudal1.harness module ``path`` imports, at any depth of the file (lazy imports too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cudal1.harness"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("cudal1.harness"))
    return found


def _folder(module: str) -> str:
    """The process folder a module lives in, or "shared".  The package itself is the parent's front
    door (it re-exports :mod:`cudal1.harness.parent.api` on first use)."""
    if module == "cudal1.harness":
        return "parent"
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[2] in FOLDERS else "shared"


MODULES = {_module(p): p for p in HARNESS.rglob("*.py")}
PACKAGES = {"cudal1.harness", *(f"cudal1.harness.{f}" for f in FOLDERS)}  # lazy or empty: importing them loads nothing
GRAPH = {m: {i for i in _imports(p) if i in MODULES and i != m and i not in PACKAGES} for m, p in MODULES.items()}


def _reach(roots: list[str], stop: set[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += [n for n in GRAPH[m] if n not in stop]
    return seen


LOADED = {  # what each process loads
    "parent": _reach([m for m in MODULES if _folder(m) == "parent"] + ["cudal1.harness"], set(ENTRIES.values())),
    "reference": _reach([ENTRIES["reference"]], set()),
    "child": _reach([ENTRIES["child"]], set()),
}


def test_the_folders_exist_and_hold_their_entry_points():
    for folder in FOLDERS:
        assert (HARNESS / folder / "__init__.py").is_file(), folder
    assert set(ENTRIES.values()) | {STARTER} <= set(MODULES)


def test_each_process_imports_only_its_folder_and_the_shared_modules():
    bad = []
    for m, deps in GRAPH.items():
        mine = _folder(m)
        for d in deps:
            theirs = _folder(d)
            if theirs == "shared" or theirs == mine:
                continue
            if m == STARTER and d in ENTRIES.values():
                continue  # the sandbox's child targets: they run in the new process
            bad.append(f"{m} ({mine}) imports {d} ({theirs})")
    assert not bad, bad


def test_only_the_sandbox_starts_the_workers():
    for folder, entry in ENTRIES.items():
        importers = sorted(m for m, deps in GRAPH.items() if entry in deps and _folder(m) != folder)
        assert importers == [STARTER], (entry, importers)


def test_a_shared_module_is_loaded_by_two_processes_and_a_folders_by_its_own():
    for m in MODULES:
        if m in PACKAGES - {"cudal1.harness"}:
            continue
        loaders = sorted(p for p, mods in LOADED.items() if m in mods)
        if _folder(m) == "shared":
            assert len(loaders) >= 2, f"{m} is loaded by {loaders or 'no process'} only: move it into that folder"
        else:
            assert loaders == [_folder(m)], f"{m} is loaded by {loaders}"


def test_the_check_sees_a_violation():
    saved = dict(GRAPH)
    try:
        GRAPH["cudal1.harness.reference.measure"] = GRAPH["cudal1.harness.reference.measure"] | {
            "cudal1.harness.child.refusal"
        }
        try:
            test_each_process_imports_only_its_folder_and_the_shared_modules()
        except AssertionError as exc:
            assert "reference.measure (reference) imports cudal1.harness.child.refusal (child)" in str(exc)
        else:
            raise AssertionError("a reference module importing the candidate's side passed the check")
    finally:
        GRAPH.clear()
        GRAPH.update(saved)


def test_no_import_cycles():
    seen: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(m: str, path: list[str]) -> None:
        seen[m] = 1
        for n in sorted(GRAPH[m]):
            if seen.get(n) == 1:
                raise AssertionError(" -> ".join(path[path.index(n):] + [n]) if n in path else f"{m} -> {n}")
            if n not in seen:
                visit(n, path + [n])
        seen[m] = 2

    for m in sorted(GRAPH):
        if m not in seen:
            visit(m, [m])
