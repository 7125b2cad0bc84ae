"""The layering, checked on the sources with ``ast`` (every ``import`` and ``from ... import`` in
a module, function-level ones included; relative imports are resolved against the module's
package, so ``from ..harness import x`` counts as ``cudal1.harness``):

    front     cli                                   (not checked: it may import everything)
    apps      search, train, report                 never each other
              recorded (judging through a run store) shared by the apps; imports no app
    policies  policy, prompts, rewrite              never the judge, never an app
    judge     harness                               no prompts, policies, apps or run stores
    base      every other top-level module          only other base modules

A new top-level module or package is a base module unless it is listed in ``NOT_BASE`` (a base
package, such as ``profile``, is checked file by file like a base module)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "cudal1"

APPS = ("search", "train", "report")
POLICIES = ("policy", "prompts", "rewrite")
RECORDED = ("recorded",)  # the one seam for recorded judging (store, resume, review) the apps share
NOT_BASE = ("cli", *APPS, *RECORDED, *POLICIES, "harness")

# package or module -> top-level cudal1 names it must not import
FORBIDDEN = {
    "harness": ("cli", *APPS, *RECORDED, *POLICIES, "store"),
    "rewrite": ("cli", *APPS, *RECORDED, "policy", "prompts", "harness"),
    "policy": ("cli", *APPS, *RECORDED, "harness"),
    "prompts": ("cli", *APPS, *RECORDED, "policy", "rewrite", "harness"),
    "recorded": ("cli", *APPS, *POLICIES),
    "search": ("cli", "train", "report"),
    "train": ("cli", "search", "report"),  # apps share base modules and `recorded`, never each other
    "report": ("cli", "search", "train"),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved)."""
    try:
        module = _module_name(path)
    except ValueError:  # a file outside the tree: its relative imports cannot be resolved
        module = ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
            else:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            names.add(base)
            if node.level and not node.module:  # `from . import x`: x may be a module
                names |= {f"{base}.{a.name}" for a in node.names}
    return names


def _top(name: str) -> str | None:
    """``cudal1.harness.parent.api`` -> ``harness``; names outside cudal1 -> None."""
    parts = name.split(".")
    return parts[1] if parts[0] == "cudal1" and len(parts) > 1 else None


def _violations(path: Path, banned: tuple[str, ...]) -> list[str]:
    return sorted(m for m in imported(path) if _top(m) in banned)


def _sources(unit: str) -> list[Path]:
    package, module = SRC / unit, SRC / f"{unit}.py"
    return sorted(package.rglob("*.py")) if package.is_dir() else [module] if module.is_file() else []


def base_modules() -> list[str]:
    modules = [p.stem for p in SRC.glob("*.py") if p.stem != "__init__"]
    packages = [p.parent.name for p in SRC.glob("*/__init__.py")]
    return sorted(m for m in modules + packages if m not in NOT_BASE)


@pytest.mark.parametrize("unit", sorted(FORBIDDEN))
def test_packages_import_only_downward(unit):
    sources = _sources(unit)
    if not sources:
        pytest.skip(f"cudal1.{unit} does not exist")
    bad = {str(f.relative_to(SRC)): _violations(f, FORBIDDEN[unit]) for f in sources}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"imports against the layering: {bad}"


@pytest.mark.parametrize("module", base_modules())
def test_base_modules_import_only_base_modules(module):
    allowed = set(base_modules())
    for source in _sources(module):
        bad = sorted(m for m in imported(source) if _top(m) is not None and _top(m) not in allowed)
        assert not bad, f"{source.relative_to(SRC)} imports {bad}; a base module may import only other base modules"


def test_base_packages_are_checked():
    """A base package's files are scanned one by one (the check above is not fooled by a folder)."""
    assert "profile" in base_modules() and len(_sources("profile")) > 1


def test_the_layer_lists_name_existing_code():
    """A rename must be followed here, or the checks above would pass on nothing."""
    missing = [u for u in (*APPS, *POLICIES, "harness", "cli") if not _sources(u)]
    assert not missing, f"no such package or module under {SRC}: {missing}"
    assert {"types", "config", "tasks", "store", "flags"} <= set(base_modules())


def test_the_shared_vocabulary_imports_no_torch():
    """Policies and the CLI read cudal1.compile_modes; only the wrapper module needs torch."""
    assert not any(m == "torch" or m.startswith("torch.") for m in imported(SRC / "compile_modes.py"))


def test_the_check_sees_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from cudal1.policy.builtin import PASSES\n    import cudal1.harness.parent.api\n")
    assert _violations(bad, FORBIDDEN["rewrite"]) == ["cudal1.harness.parent.api", "cudal1.policy.builtin"]


def test_relative_imports_are_resolved(tmp_path, monkeypatch):
    package = tmp_path / "cudal1" / "rewrite"
    package.mkdir(parents=True)
    mod = package / "bad.py"
    mod.write_text("from ..harness import api\nfrom .. import store\nfrom .emit import emit_class\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path / "cudal1")
    assert imported(mod) == {"cudal1.harness", "cudal1", "cudal1.store", "cudal1.rewrite.emit"}
    assert _violations(mod, FORBIDDEN["rewrite"]) == ["cudal1.harness"]
    assert _violations(mod, FORBIDDEN["harness"]) == ["cudal1.rewrite.emit", "cudal1.store"]


@pytest.mark.cpu
def test_the_worker_launcher_starts_before_torch_is_imported():
    """The CLI calls ``launcher.prestart()`` before it imports the judge, so the forkserver's preload
    of torch overlaps the command's own imports: importing the launcher (and the harness package)
    must not import torch, and ``prestart`` must leave a forkserver running."""
    import subprocess
    import sys

    code = ("import sys, cudal1.harness.parent.launcher as launcher\n"
            "assert 'torch' not in sys.modules, 'the launcher imported torch'\n"
            "launcher.prestart()\n"
            "from multiprocessing import forkserver\n"
            "assert forkserver._forkserver._forkserver_pid, 'no forkserver was started'\n"
            "assert 'torch' not in sys.modules\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "ok", proc.stderr[-2000:]
