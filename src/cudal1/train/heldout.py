"""Keeping KernelBench's held-out tasks out of training (``collect``, ``train sft|ssl|grpo``).

The split is :func:`cudal1.tasks.split_of`'s: by level and problem id, a task is held out when its
id is a multiple of 5.  A task is recognised as held out in two ways, so a renamed copy is caught:

* by **identity**: a level and problem id in the held-out split (a task, or a data record whose
  ``task`` is ``levelL/ID``);
* by **source**: the :func:`fingerprint` of its reference source (its Python tokens without
  comments, spacing or blank lines) equals a held-out task's — whatever its name.  Known held-out
  sources: KernelBench's (main at 423217d, levels 1-4) and the KernelBench v0 texts of CUDA-L1's
  H100 release (levels 1-3) shipped in :mod:`.heldout_sources`, plus the held-out tasks of a local
  KernelBench copy when one is given (``--source``, else ``$CUDAL1_KERNELBENCH``).  Data records
  are matched by the reference code in their prompt (every ``python`` block of the user turn).

Contract: :class:`HeldOut` answers :meth:`~HeldOut.reason` for a task and
:meth:`~HeldOut.record_reason` for a chat record (``None``: not held out); :func:`refuse` raises
:class:`HeldOutError` (one line, naming up to three of them and ``--allow-held-out``) when any
given task is held out; :func:`overlap` lists the tasks two sets share (GRPO's eval split must not
be trained on).  Nothing here downloads: without a local KernelBench copy the shipped fingerprints
and the identity rule are what is checked.

Not covered: a held-out task edited beyond comments and spacing (another size, a renamed
variable) is a different task to this check; so is a program that answers a held-out task
without its reference in the prompt.

``python -m cudal1.train.heldout KERNELBENCH.jsonl [RELEASE.jsonl ...]`` prints the shipped module
for other copies (KernelBench's ``level``/``problem_id``/``code`` lines, CUDA-L1's release lines).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from cudal1.tasks import split_of
from cudal1.types import Task

_SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER}
_FSTRING_START = {getattr(tokenize, n) for n in ("FSTRING_START", "TSTRING_START") if hasattr(tokenize, n)}
_FSTRING_END = {getattr(tokenize, n) for n in ("FSTRING_END", "TSTRING_END") if hasattr(tokenize, n)}
_BLOCK = re.compile(r"^(`{3,})python[^\n]*\n(.*?)^\1[ \t]*$", re.MULTILINE | re.DOTALL)
_TASK_ID = re.compile(r"level(\d+)/(\d+)")


class HeldOutError(ValueError):
    """Held-out tasks would be trained on (one line)."""


def fingerprint(source: str) -> str | None:
    """A hash of ``source``'s Python tokens, comments, blank lines and spacing left out (indentation
    kept as tokens); the same on every Python version (3.12's split f-string tokens are read back
    as one literal).  ``None`` when the text does not tokenize."""
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    text = "".join(lines)
    parts: list[str] = []
    depth, start = 0, (0, 0)
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type in _FSTRING_START:
                depth, start = depth + 1, (start if depth else tok.start)
                continue
            if depth:
                if tok.type in _FSTRING_END:
                    depth -= 1
                    if not depth:  # the whole literal as written, as 3.11 tokenizes it
                        parts.append(text[offsets[start[0] - 1] + start[1]:offsets[tok.end[0] - 1] + tok.end[1]])
                continue
            if tok.type in _SKIP:
                continue
            parts.append({tokenize.NEWLINE: "\n", tokenize.INDENT: ">", tokenize.DEDENT: "<"}.get(tok.type, tok.string))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


def _held_out_id(level: int | None, problem_id: int | None) -> bool:
    return split_of(Task(name="", source="", level=level, problem_id=problem_id)) == "held-out"


@dataclass
class HeldOut:
    """The held-out tasks this run knows: fingerprint -> what it is (e.g. ``level1/5``)."""

    sources: dict[str, str] = field(default_factory=dict)
    _seen: dict[str, str | None] = field(default_factory=dict, repr=False)  # code block -> fingerprint

    @classmethod
    def load(cls, kernelbench: str | os.PathLike[str] | None = None) -> "HeldOut":
        """The shipped fingerprints, plus the held-out tasks of a local KernelBench copy
        (``kernelbench``, else ``$CUDAL1_KERNELBENCH`` when set; never a download)."""
        from cudal1.train.heldout_sources import FINGERPRINTS

        held = cls(dict(FINGERPRINTS))
        local = kernelbench or os.environ.get("CUDAL1_KERNELBENCH")
        if local and Path(local).exists():
            from cudal1.tasks import TaskError, load_tasks

            try:
                tasks = load_tasks(local)
            except TaskError:  # not a task source we can read: the shipped fingerprints still apply
                tasks = []
            held.add(t for t in tasks if split_of(t) == "held-out")
        return held

    def add(self, tasks: Iterable[Task]) -> None:
        for task in tasks:
            fp = fingerprint(task.source)
            if fp is not None:
                self.sources.setdefault(fp, task.task_id)

    def _source_match(self, code: str) -> str | None:
        if code not in self._seen:
            self._seen[code] = fingerprint(code)
        fp = self._seen[code]
        return self.sources.get(fp) if fp is not None else None

    def reason(self, task: Task) -> str | None:
        """Why ``task`` is held out (``None``: it is not)."""
        if _held_out_id(task.level, task.problem_id):
            return f"{task.task_id} (held-out id)"
        same = self._source_match(task.source)
        return f"{task.task_id} (the source of {same})" if same else None

    def record_reason(self, record: dict[str, Any]) -> str | None:
        """Why a chat record (``messages`` plus ``collect``'s provenance) trains on a held-out task."""
        name = str(record.get("task") or "")
        m = _TASK_ID.fullmatch(name)
        if m and _held_out_id(int(m.group(1)), int(m.group(2))):
            return f"{name} (held-out id)"
        for msg in record.get("messages") or []:
            if isinstance(msg, dict) and msg.get("role") == "user" and isinstance(msg.get("content"), str):
                for block in _BLOCK.finditer(msg["content"]):
                    same = self._source_match(block.group(2))
                    if same:
                        return f"{name or 'a record'} (its prompt holds the source of {same})"
        return None


def _message(what: str, reasons: list[str], total: int) -> str:
    shown = "; ".join(reasons[:3]) + (f"; and {len(reasons) - 3} more" if len(reasons) > 3 else "")
    return (f"{what}: {len(reasons)} of {total} would train on held-out tasks: {shown}. Use a :train suite "
            "(e.g. kernelbench:train), or pass --allow-held-out to train on them anyway")


def refuse(tasks: Iterable[Task], what: str, held: HeldOut | None = None) -> None:
    """Raise :class:`HeldOutError` when any of ``tasks`` is held out."""
    tasks = list(tasks)
    held = held or HeldOut.load()
    reasons = [r for r in (held.reason(t) for t in tasks) if r]
    if reasons:
        raise HeldOutError(_message(what, reasons, len(tasks)))


def refuse_records(records: Iterable[dict[str, Any]], what: str, held: HeldOut | None = None) -> None:
    """Raise :class:`HeldOutError` when any chat record trains on a held-out task."""
    records = list(records)
    held = held or HeldOut.load()
    reasons = [r for r in (held.record_reason(rec) for rec in records) if r]
    if reasons:
        raise HeldOutError(_message(what, reasons, len(records)))


def overlap(a: Iterable[Task], b: Iterable[Task]) -> list[str]:
    """The tasks of ``b`` that are also in ``a`` (the same hash, level and problem id, or
    fingerprint), each as ``"B = A"`` (their task ids)."""
    index = HeldOut()
    a = list(a)
    index.add(a)
    by_id = {(t.level, t.problem_id): t.task_id for t in a if t.level is not None and t.problem_id is not None}
    by_hash = {t.hash: t.task_id for t in a}
    found = []
    for t in b:
        same = by_hash.get(t.hash) or by_id.get((t.level, t.problem_id)) or index._source_match(t.source)
        if same:
            found.append(f"{t.task_id} = {same}")
    return found


def _sources_module(paths: list[str]) -> str:
    """The text of :mod:`.heldout_sources` from KernelBench and CUDA-L1 release JSONL files."""
    from cudal1.jsonl import iter_jsonl

    found: dict[str, str] = {}
    for path in paths:
        for _, rec in iter_jsonl(path):
            level, pid = rec.get("level", rec.get("level_id")), rec.get("problem_id", rec.get("task_id"))
            code = rec.get("code", rec.get("ref_code"))
            if isinstance(code, str) and isinstance(level, int) and isinstance(pid, int) and _held_out_id(level, pid):
                fp = fingerprint(code)
                if fp is not None:
                    found.setdefault(fp, f"level{level}/{pid}")
    body = "".join(f'    "{fp}": "{tid}",\n' for fp, tid in sorted(found.items(), key=lambda kv: (kv[1], kv[0])))
    return (
        '"""Fingerprints (:func:`cudal1.train.heldout.fingerprint`) of KernelBench\'s held-out reference sources.\n\n'
        f"Generated by ``python -m cudal1.train.heldout {' '.join(Path(p).name for p in paths)}``.\n"
        '"""\n\nFINGERPRINTS: dict[str, str] = {\n' + body + "}\n"
    )


if __name__ == "__main__":
    import sys

    print(_sources_module(sys.argv[1:]), end="")
