"""The layering (front cli -> apps search/train/report -> policies policy/prompts/rewrite -> judge
harness -> base modules; imports point downward only), checked on the sources with ``ast``: every
``import``/``from ... import`` anywhere in a module, function-level ones included.  Relative
imports stay inside their package and are not checked; neither is cli.  The apps (search, train,
report) do not import each other."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "cudal1"

# package (or base module) -> cudal1 packages it must not import
FORBIDDEN = {
    "harness": ("prompts", "policy", "search", "train", "report", "rewrite"),
    "rewrite": ("policy", "harness", "prompts", "search", "train", "report"),
    "policy": ("harness", "search", "train", "report"),
    "prompts": ("harness", "policy", "search", "train", "report"),
    "search": ("train", "report"),
    "train": ("search", "report"),  # apps share base modules (types.reference_candidate, releases), never each other
    "report": ("search", "train"),
}
BASE = ("types.py", "config.py", "flags.py", "compile_modes.py", "cuda_graph.py", "figures.py", "releases.py")
BASE_MAY_IMPORT = ("cudal1.types", "cudal1.config", "cudal1.flags", "cudal1.jsonl", "cudal1.tasks")


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _violations(path: Path, banned: tuple[str, ...]) -> list[str]:
    return sorted(m for m in imported(path) if any(m == f"cudal1.{b}" or m.startswith(f"cudal1.{b}.") for b in banned))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_packages_import_only_downward(package):
    bad = {str(f.relative_to(SRC)): _violations(f, FORBIDDEN[package]) for f in sorted((SRC / package).rglob("*.py"))}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"imports against the layering: {bad}"


@pytest.mark.parametrize("module", BASE)
def test_base_modules_import_only_base_modules(module):
    bad = sorted(m for m in imported(SRC / module) if m.startswith("cudal1") and m not in BASE_MAY_IMPORT)
    assert not bad, f"{module} imports {bad}"


def test_the_shared_vocabulary_imports_no_torch():
    """Policies and the CLI read cudal1.compile_modes; only the wrapper module needs torch."""
    assert not any(m == "torch" or m.startswith("torch.") for m in imported(SRC / "compile_modes.py"))


def test_the_check_sees_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from cudal1.policy.builtin import PASSES\n    import cudal1.harness.api\n")
    assert _violations(bad, FORBIDDEN["rewrite"]) == ["cudal1.harness.api", "cudal1.policy.builtin"]


def test_the_worker_launcher_starts_before_torch_is_imported():
    """The CLI calls ``launcher.prestart()`` before it imports the judge, so the forkserver's preload
    of torch overlaps the command's own imports: importing the launcher (and the harness package)
    must not import torch, and ``prestart`` must leave a forkserver running."""
    import subprocess
    import sys

    code = ("import sys, cudal1.harness.launcher as launcher\n"
            "assert 'torch' not in sys.modules, 'the launcher imported torch'\n"
            "launcher.prestart()\n"
            "from multiprocessing import forkserver\n"
            "assert forkserver._forkserver._forkserver_pid, 'no forkserver was started'\n"
            "assert 'torch' not in sys.modules\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "ok", proc.stderr[-2000:]
