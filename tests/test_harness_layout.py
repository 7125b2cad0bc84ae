"""The harness laid out by trust boundary: what the clean side may import, and no import cycles."""

from __future__ import annotations

import ast
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[1] / "src" / "cudal1" / "harness"
CLEAN = ("refworker", "measure", "link", "hostload", "numerics", "compare", "degenerate", "memory")  # the reference worker's modules
PARENT = ("api", "plan", "batch", "evaluator", "lease", "assemble", "stats", "farm", "batchstats", "ray_backend",
          "gpu_share")


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


MODULES = {_module(p): p for p in HARNESS.rglob("*.py")}
GRAPH = {m: {i for i in _imports(p) if i in MODULES and i != m and i != "cudal1.harness"} for m, p in MODULES.items()}


def test_the_clean_side_never_imports_what_runs_beside_candidate_code():
    for name in CLEAN + PARENT:
        module = f"cudal1.harness.{name}"
        assert module in MODULES, module
        child = sorted(i for i in GRAPH[module] if i.startswith("cudal1.harness.child"))
        assert not child, f"{module} imports {child}"


def test_only_the_sandbox_starts_the_candidates_process():
    importers = sorted(m for m, deps in GRAPH.items() if "cudal1.harness.child.worker" in deps)
    assert importers == ["cudal1.harness.sandbox"], importers


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
