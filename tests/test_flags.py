"""flags: the registry of verdict flags, and a scan of the sources for every flag literal the judge
(and the apps that add flags, e.g. the optional reviewer) emits: an unregistered flag fails here,
not in a user's report.

The scan reads ``src/cudal1/**/*.py`` with ``ast`` and collects string literals in flag
positions: ``Verdict(status, message, *flags)``, ``Mismatch(flag, ...)``, ``Finding(check, flag,
...)``, any ``flag=``/``flags=`` keyword, ``<...flags>.append/extend/add/insert(...)``, assignments
to a name or attribute ending in ``flag``/``flags``, comparisons with one, and the first element of
tuples returned by functions whose docstring starts with ``(flag,``.  A flag built at run time
from parts is not seen; the reverse check (every registered flag is found) keeps the scan honest
when the code changes shape (a new way of writing flags must be taught to the scan).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from cudal1 import flags

SRC = Path(__file__).resolve().parents[1] / "src" / "cudal1"
README = SRC.parents[1] / "README.md"


class TestFlags:
    def test_unknown_flag(self):
        with pytest.raises(KeyError):
            flags.check("definitely_not_a_flag")

    def test_known_flag(self):
        assert flags.check("cpu_timing") == "cpu_timing"

    def test_all_flags_documented(self):
        for name, text in flags.FLAGS.items():
            assert name == name.lower() and " " not in name
            assert text

    def test_load_dependent_flags_are_registered(self):
        assert flags.LOAD_DEPENDENT <= set(flags.FLAGS)
        assert "timing_mismatch" not in flags.LOAD_DEPENDENT  # a verdict's reason is compared, always


def readme_flags(text: str) -> list[str]:
    """Flag names in the first column of the table under the README's ``## Flags`` heading."""
    section = re.search(r"^## Flags\n(.*?)(?=^## )", text, re.S | re.M)
    assert section, "README.md has no '## Flags' section"
    rows = [line for line in section.group(1).splitlines() if line.startswith("|") and "---" not in line]
    return [name for row in rows[1:] for name in re.findall(r"`([a-z][a-z0-9_]*)`", row.split("|")[1])]


def test_the_readme_documents_exactly_the_registered_flags():
    """Users read the flags in the README; a flag added to the registry must be explained there."""
    documented = readme_flags(README.read_text())
    assert sorted(documented) == sorted(set(documented)), "a flag is listed twice in README.md"
    assert set(documented) == set(flags.FLAGS), (
        f"README.md's flag table: missing {sorted(set(flags.FLAGS) - set(documented))}, "
        f"unknown {sorted(set(documented) - set(flags.FLAGS))}"
    )


def test_the_readme_table_reader_sees_rows_with_several_flags():
    text = "## Flags\n\n| flag | meaning |\n|---|---|\n| `a_b` | x |\n| `c`, `d_l2` | y `not_me` |\n\n## Next\n"
    assert readme_flags(text) == ["a_b", "c", "d_l2"]


# ---- the scan ------------------------------------------------------------------------------------

FLAG_CALLS = {"Verdict": ("args", 2), "Mismatch": ("arg", 0), "Finding": ("arg", 1)}


def _strings(node):
    """String constants of ``node`` when it is one, or a list/tuple/set display of them (through
    conditional expressions and ``+``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [c for e in node.elts for c in _strings(e)]
    if isinstance(node, ast.IfExp):
        return _strings(node.body) + _strings(node.orelse)
    if isinstance(node, ast.BinOp):
        return _strings(node.left) + _strings(node.right)
    return []


def _flaggy(node):
    text = ast.unparse(node) if node is not None else ""
    tail = text.rsplit(".", 1)[-1]
    return tail.endswith("flags") or tail == "flag"


def flag_literals(source, filename="<src>"):
    out = []
    tree = ast.parse(source, filename)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func).rsplit(".", 1)[-1]
            if name in FLAG_CALLS:
                kind, i = FLAG_CALLS[name]
                args = node.args[i:] if kind == "args" else node.args[i:i + 1]
                for a in args:
                    out += _strings(a)
            for kw in node.keywords:
                if kw.arg in ("flag", "flags"):
                    out += _strings(kw.value)
            if isinstance(node.func, ast.Attribute) and node.func.attr in ("append", "extend", "add", "insert") \
                    and _flaggy(node.func.value):
                for a in node.args:
                    out += _strings(a)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if (
                    isinstance(t, ast.Tuple)
                    and isinstance(node.value, ast.Tuple)
                    and len(t.elts) == len(node.value.elts)
                ):
                    out += [c for te, ve in zip(t.elts, node.value.elts) if _flaggy(te) for c in _strings(ve)]
                elif _flaggy(t) and node.value is not None:
                    out += _strings(node.value)
        elif isinstance(node, ast.For) and isinstance(node.iter, (ast.Tuple, ast.List)):
            # `for flag in ("a", "b")` and `for flag, why in (("a", x), ("b", y))`
            if _flaggy(node.target):
                out += _strings(node.iter)
            elif isinstance(node.target, ast.Tuple):
                slots = [i for i, e in enumerate(node.target.elts) if _flaggy(e)]
                for item in node.iter.elts:
                    if isinstance(item, ast.Tuple) and len(item.elts) == len(node.target.elts):
                        out += [c for i in slots for c in _strings(item.elts[i])]
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_flaggy(s) for s in sides):
                out += [c for s in sides for c in _strings(s)]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node) or ""
            if doc.startswith("(flag,"):  # returns (flag, message) tuples
                for r in ast.walk(node):
                    if isinstance(r, ast.Return) and isinstance(r.value, ast.Tuple) and r.value.elts:
                        out += _strings(r.value.elts[0])
    return [(c.value, c.lineno) for c in out]


def _emitted() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        for value, line in flag_literals(path.read_text(), str(path)):
            found.setdefault(value, []).append(f"{path.relative_to(SRC.parent)}:{line}")
    return found


def test_every_flag_the_judge_emits_is_registered():
    unregistered = {k: v for k, v in _emitted().items() if k not in flags.FLAGS}
    assert not unregistered, f"flags emitted but not in cudal1/flags.py: {unregistered}"


def test_every_registered_flag_is_found_in_the_sources():
    """No dead entries, and proof the scan still sees every place a flag is written."""
    missing = sorted(set(flags.FLAGS) - set(_emitted()))
    assert not missing, f"registered flags the scan finds nowhere in {SRC}: {missing}"


@pytest.mark.parametrize("snippet", [
    'raise Verdict("rejected", "msg", "made_up")',
    'raise Verdict("rejected", f"{x}", "side_stream", "made_up", correctness=c)',
    'return Mismatch("made_up", "detail")',
    'out.append(Finding("check", "made_up", 3, "message"))',
    'r = EvalResult(status=s, flags=["cpu_timing", "made_up"])',
    'self.extra_flags.append("made_up")',
    'r.flags.extend(["made_up"])',
    'flags = ["made_up"] if cond else []',
    'r.status, r.flags = Status.REJECTED, ["made_up"]',
    'if "made_up" not in r.flags:\n    pass',
    'if mismatch.flag == "made_up":\n    pass',
    'def violation(self):\n    """(flag, message) or None."""\n    return "made_up", "why"',
    'for flag in ("cpu_timing", "made_up"):\n    pass',
    'for flag, why in (("cpu_timing", a), ("made_up", b)):\n    pass',
], ids=lambda s: s.split("(")[0].split()[-1][:20])
def test_the_scan_sees_each_way_a_flag_is_written(snippet):
    assert "made_up" in [v for v, _ in flag_literals(snippet)]


def test_the_scan_ignores_other_strings():
    src = ('log.info("made_up")\nraise Verdict("rejected", "made_up message")\nname = "made_up"\nstatus = "made_up"\n'
           'for flag, why in (("cpu_timing", "made_up"),):\n    pass\nfor name in ("made_up",):\n    pass\n')
    assert [v for v, _ in flag_literals(src)] == ["cpu_timing"]
