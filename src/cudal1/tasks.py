"""Loading KernelBench-format tasks: files, directories, JSONL, Hugging Face, suite selectors.

Contract: every loader returns :class:`cudal1.types.Task` values whose ``source`` is the task's
Python text, checked with :func:`ast.parse` to define ``Model``, ``get_inputs`` and
``get_init_inputs`` at module level.  Anything wrong with the input (missing file, bad JSON line,
unknown selector, no matching task, unparsable source) raises :class:`TaskError` with a one-line
message.  Task code is never executed and torch is never imported here: the judge runs task code
only in child processes.

Limits: the check is syntactic.  It does not prove that ``Model`` is an ``nn.Module``, that
``get_inputs`` returns tensors, or that the task's imports, sizes or weights (level 4 loads
Hugging Face models) are available; those failures surface when the judge runs the task.
``load_task_hf`` needs the optional ``datasets`` package (``pip install cudal1[hf]``) and network
or a warm cache.

Selectors: ``kernelbench``, ``kernelbench:level1``, ``kernelbench:level2/17``,
``kernelbench:level1/1-20``, ``kernelbench:level1/1,3,5-7``, and the fixed train/held-out split,
alone or after a level: ``kernelbench:train``, ``kernelbench:held-out``,
``kernelbench:level2:held-out``.

The split (:func:`split_of`) is by level and problem id, the same on every machine and for every
copy of KernelBench: a task is **held out** when its problem id is a multiple of
:data:`HELD_OUT_EVERY` (5): level 1 ids 5, 10, ..., 100 (20 of 100 tasks), level 2 the same (20 of
100), level 3 ids 5, ..., 50 (10 of 50), level 4 ids 5, 10, 15, 20 (4 of 20).  Every fifth id
spreads the held-out tasks over each level's families (KernelBench numbers related problems
consecutively).  Everything else is **train**.  A task without a level and problem id is in
neither.
"""

from __future__ import annotations

import ast
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from cudal1.types import Task

__all__ = [
    "HELD_OUT_EVERY",
    "KERNELBENCH_HF",
    "SPLITS",
    "Selector",
    "TaskError",
    "find_task",
    "load_task_dir",
    "load_task_file",
    "load_task_hf",
    "load_task_jsonl",
    "load_tasks",
    "parse_selector",
    "resolve_suite",
    "split_of",
]

KERNELBENCH_HF = "ScalingIntelligence/KernelBench"
ENV_KERNELBENCH = "CUDAL1_KERNELBENCH"
SUITES = ("kernelbench",)
REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")

PathLike = str | os.PathLike[str]


class TaskError(ValueError):
    """A task input could not be loaded; the message is one line naming the input and the fault."""


# ---------------------------------------------------------------------------------------------
# Source checking and Task construction


def _one_line(text: object) -> str:
    lines = str(text).strip().splitlines()
    return lines[0] if lines else ""


def check_source(source: str, where: str) -> None:
    """Raise TaskError unless ``source`` parses and defines the KernelBench names at top level.

    Top-level ``class``/``def``/assignments count; names made only by imports or ``exec`` do not.
    """
    try:
        tree = ast.parse(source, filename=where)
    except SyntaxError as e:
        raise TaskError(f"{where}: not valid Python (line {e.lineno}: {e.msg})") from None
    except ValueError as e:  # e.g. null bytes in the source
        raise TaskError(f"{where}: not valid Python ({_one_line(e)})") from None
    defined: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined.update(t.id for t in targets if isinstance(t, ast.Name))
    missing = [name for name in REQUIRED_NAMES if name not in defined]
    if missing:
        raise TaskError(f"{where}: not a KernelBench task (missing {', '.join(missing)})")


def _make_task(name: str, source: str, level: int | None, problem_id: int | None,
               origin: str) -> Task:
    check_source(source, origin)
    return Task(name=name, source=source, level=level, problem_id=problem_id, origin=origin)


def _sort_key(task: Task) -> tuple[Any, ...]:
    return (task.level is None, task.level or 0, task.problem_id is None,
            task.problem_id or 0, task.name)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise TaskError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise TaskError(f"{path}: cannot read ({e.strerror or e})") from None


# ---------------------------------------------------------------------------------------------
# Files and directories


def load_task_file(path: PathLike) -> Task:
    """Load one task file.  Name is the stem; ``levelN/<digits>_x.py`` sets level, problem_id."""
    p = Path(path)
    if not p.is_file():
        raise TaskError(f"no such task file: {p}")
    level = problem_id = None
    dir_match = re.fullmatch(r"level(\d+)", p.parent.name)
    stem_match = re.match(r"(\d+)_", p.stem)
    if dir_match and stem_match:
        level, problem_id = int(dir_match.group(1)), int(stem_match.group(1))
    return _make_task(p.stem, _read_text(p), level, problem_id, str(p))


def load_task_dir(path: PathLike, skipped: list[tuple[str, str]] | None = None) -> list[Task]:
    """Load every ``*.py`` under ``path`` (recursively), sorted by (level, problem_id, name).

    Skips files whose name starts with ``_`` (``__init__.py``) and hidden directories.  A
    directory with no task files is a TaskError.  A file that does not load is a TaskError too,
    unless ``skipped`` is a list: then it is appended there as ``(path, error)`` and the others
    load (a directory where no file loads is still a TaskError).
    """
    root = Path(path)
    if not root.is_dir():
        raise TaskError(f"no such task directory: {root}")
    files = [
        f for f in root.rglob("*.py")
        if f.is_file() and not f.name.startswith("_")
        and not any(part.startswith(".") for part in f.relative_to(root).parts[:-1])
    ]
    if not files:
        raise TaskError(f"no task files (*.py) in directory: {root}")
    if skipped is None:
        return sorted((load_task_file(f) for f in files), key=_sort_key)
    tasks, errors = [], []
    for f in sorted(files):
        try:
            tasks.append(load_task_file(f))
        except TaskError as exc:
            errors.append((str(f), str(exc)))
    if not tasks:
        raise TaskError(f"no loadable task file in directory {root} ({len(errors)} with errors; first: {errors[0][1]})")
    skipped.extend(errors)
    return sorted(tasks, key=_sort_key)


# ---------------------------------------------------------------------------------------------
# Records (JSONL, Hugging Face)


def _int_field(record: dict[str, Any], keys: tuple[str, ...], where: str) -> int | None:
    for key in keys:
        value = record.get(key)
        if value is None:
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().isdigit():
            return int(value)
        raise TaskError(f"{where}: field {key!r} is not an integer: {value!r}")
    return None


def task_from_record(record: Any, where: str) -> Task:
    """Build a Task from a KernelBench record (``level``, ``problem_id``, ``name``, ``code``) or a
    CUDA-L1 release record (``level_id``, ``task_id``, ``ref_code``; named ``level{L}_{id}``)."""
    if not isinstance(record, dict):
        raise TaskError(f"{where}: expected a JSON object, got {type(record).__name__}")
    source = record.get("code")
    if source is None:
        source = record.get("ref_code")
    if not isinstance(source, str) or not source.strip():
        raise TaskError(f"{where}: record has no task source ('code' or 'ref_code')")
    level = _int_field(record, ("level", "level_id"), where)
    problem_id = _int_field(record, ("problem_id", "task_id"), where)
    name = record.get("name")
    if name is None or name == "":
        if level is None or problem_id is None:
            raise TaskError(f"{where}: record has no 'name' and no level/problem id to name it by")
        name = f"level{level}_{problem_id}"
    elif not isinstance(name, str):
        raise TaskError(f"{where}: field 'name' is not a string: {name!r}")
    return _make_task(name, source, level, problem_id, where)


def load_task_jsonl(path: PathLike) -> list[Task]:
    """Load one task per non-blank JSONL line, in file order.  An empty file is an error."""
    p = Path(path)
    if not p.is_file():
        raise TaskError(f"no such task file: {p}")
    tasks = []
    for lineno, line in enumerate(_read_text(p).splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{p}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
        tasks.append(task_from_record(record, where))
    if not tasks:
        raise TaskError(f"no tasks in {p}")
    return tasks


def load_task_hf(dataset_name: str, level: int | None = None) -> list[Task]:
    """Load tasks from a Hugging Face dataset with splits ``level_1``, ``level_2``, … and columns
    ``code``, ``level``, ``name``, ``problem_id`` (KernelBench's layout).
    ``level`` picks one split.

    Needs the optional ``datasets`` package and network access or a warm HF cache.
    """
    from cudal1.extras import require

    require(f"loading {dataset_name!r}", "datasets", extra="hf")
    offline = not _hub_reachable()
    if offline:  # read the local cache only, instead of minutes of retried requests
        _hub_offline()
    import logging

    import datasets  # optional dependency, imported only here

    quiet = [logging.getLogger(n) for n in ("huggingface_hub", "datasets", "fsspec")]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.ERROR)
    try:
        if level is not None:
            split = f"level_{level}"
            splits = {split: datasets.load_dataset(dataset_name, split=split)}
        else:
            splits = dict(datasets.load_dataset(dataset_name))
    except Exception as e:  # noqa: BLE001 - datasets raises many types (network, missing split, auth)
        if offline:
            raise TaskError(f"cannot load HF dataset {dataset_name!r}: the Hugging Face hub is not reachable and the "
                            f"dataset is not cached; give --source PATH (a KernelBench JSONL or task directory) or set "
                            f"${ENV_KERNELBENCH}") from None
        raise TaskError(f"cannot load HF dataset {dataset_name!r}: {_one_line(e)}") from None
    finally:
        for q, lv in zip(quiet, levels):
            q.setLevel(lv)
    tasks = [
        task_from_record(dict(row), f"hf:{dataset_name}/{split}[{i}]")
        for split, rows in splits.items()
        for i, row in enumerate(rows)
    ]
    if not tasks:
        raise TaskError(f"no tasks in HF dataset {dataset_name!r}")
    return sorted(tasks, key=_sort_key)


# The offline switches the Hugging Face packages read from the environment once, at import:
# module -> its flags (each also the name of the environment variable it is read from).
HUB_OFFLINE_FLAGS: dict[str, tuple[str, ...]] = {
    "huggingface_hub.constants": ("HF_HUB_OFFLINE",),
    "datasets.config": ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"),
}


def _hub_offline() -> None:
    """Switch the Hugging Face hub to offline mode for the rest of the process (so a later call
    also skips the reachability probe): the environment variables for a later import of
    ``huggingface_hub`` / ``datasets``, and :data:`HUB_OFFLINE_FLAGS` where they are already
    imported (they never read the environment again: left alone, each request was retried for
    ~20 s before failing)."""
    for module, names in HUB_OFFLINE_FLAGS.items():
        imported = sys.modules.get(module)
        for name in names:
            os.environ[name] = "1"
            if imported is not None and hasattr(imported, name):
                setattr(imported, name, True)


def _hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connection (``$HF_ENDPOINT``, else
    huggingface.co); False at once when ``$HF_HUB_OFFLINE`` is set."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "").strip() not in ("", "0"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        with socket.create_connection(
            (url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)), timeout=timeout_s
        ):
            return True
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------
# Suite selectors

_SELECTOR_RE = re.compile(r"(?P<suite>[A-Za-z][\w-]*)(?::level(?P<level>\d+)(?:/(?P<ids>[^/:]+))?)?"
                          r"(?::(?P<split>(?!level)[A-Za-z][\w-]*))?")
SPLITS = ("train", "held-out")
HELD_OUT_EVERY = 5


def split_of(task: Task) -> str | None:
    """``"held-out"`` or ``"train"`` by the fixed KernelBench split (module docstring); ``None`` for
    a task without a level and problem id."""
    if task.level is None or task.problem_id is None:
        return None
    return "held-out" if task.problem_id % HELD_OUT_EVERY == 0 else "train"


@dataclass(frozen=True)
class Selector:
    """A parsed suite selector: ``suite[:levelN[/ids]][:split]``; ``ids`` sorted and de-duplicated."""

    suite: str
    level: int | None = None
    ids: tuple[int, ...] | None = None
    split: str | None = None  # "train" | "held-out" (see split_of)

    def __str__(self) -> str:
        text = self.suite if self.level is None else f"{self.suite}:level{self.level}"
        text = text if self.ids is None else f"{text}/{','.join(map(str, self.ids))}"
        return text if self.split is None else f"{text}:{self.split}"


def _parse_ids(text: str, selector: str) -> tuple[int, ...]:
    ids: set[int] = set()
    for item in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", item)
        if not m:
            raise TaskError(f"bad id list in selector {selector!r}: {item.strip()!r} "
                            "(expected N, N-M or a comma list of those)")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise TaskError(f"bad id range in selector {selector!r}: {lo}-{hi} is empty")
        ids.update(range(lo, hi + 1))
    return tuple(sorted(ids))


def parse_selector(text: str) -> Selector:
    """Parse ``kernelbench``, ``kernelbench:level1``, ``kernelbench:level2/17``,
    ``kernelbench:level1/1-20``, ``kernelbench:level1/1,3,5-7``, each optionally followed by a
    split (``:train`` or ``:held-out``, e.g. ``kernelbench:held-out``); anything else is a
    TaskError."""
    stripped = text.strip()
    m = _SELECTOR_RE.fullmatch(stripped)
    if not m:
        raise TaskError(f"bad suite selector {text!r} (expected e.g. kernelbench:level1/1-20 or kernelbench:held-out)")
    split = m.group("split").lower() if m.group("split") else None
    if split is not None and split not in SPLITS:
        raise TaskError(f"unknown split {m.group('split')!r} in selector {text!r} (known: {', '.join(SPLITS)})")
    suite = m.group("suite").lower()
    if suite not in SUITES:
        raise TaskError(f"unknown suite {m.group('suite')!r} in selector {text!r} "
                        f"(known: {', '.join(SUITES)})")
    level = int(m.group("level")) if m.group("level") is not None else None
    ids = _parse_ids(m.group("ids"), stripped) if m.group("ids") is not None else None
    return Selector(suite=suite, level=level, ids=ids, split=split)


def _load_source(source: PathLike) -> list[Task]:
    p = Path(source)
    if p.is_dir():
        return load_task_dir(p)
    if p.is_file():
        return load_task_jsonl(p)
    raise TaskError(f"no such suite source (JSONL file or directory): {p}")


def resolve_suite(selector_text: str, source: PathLike | None = None) -> list[Task]:
    """Tasks matching a selector, sorted by (level, problem_id, name).

    ``source`` is a JSONL file or a task directory; when None, the path in ``$CUDAL1_KERNELBENCH``
    is used, else the Hugging Face dataset ``ScalingIntelligence/KernelBench``.  Requested ids
    that are absent are a TaskError naming them, as is a selector that matches nothing.
    """
    sel = parse_selector(selector_text)
    if source is None:
        source = os.environ.get(ENV_KERNELBENCH) or None
    if source is not None:
        tasks, origin = _load_source(source), str(source)
    else:
        tasks, origin = load_task_hf(KERNELBENCH_HF, level=sel.level), f"hf:{KERNELBENCH_HF}"
    if sel.level is not None:
        tasks = [t for t in tasks if t.level == sel.level]
    if sel.ids is not None:
        wanted = set(sel.ids)
        tasks = [t for t in tasks if t.problem_id in wanted]
        missing = sorted(wanted - {t.problem_id for t in tasks})
        if missing:
            raise TaskError(f"{selector_text}: no task with id {', '.join(map(str, missing))} "
                            f"in level {sel.level} of {origin}")
    if sel.split is not None:
        unsplit = [t.task_id for t in tasks if split_of(t) is None]
        if unsplit:
            raise TaskError(f"{selector_text}: the {sel.split} split needs tasks with a level and problem id "
                            f"({len(unsplit)} without, e.g. {unsplit[0]}, in {origin})")
        tasks = [t for t in tasks if split_of(t) == sel.split]
    if not tasks:
        raise TaskError(f"no tasks matched {selector_text!r} in {origin}")
    return sorted(tasks, key=_sort_key)


# ---------------------------------------------------------------------------------------------
# Front door and lookup


def load_tasks(
    spec: PathLike, source: PathLike | None = None, skipped: list[tuple[str, str]] | None = None
) -> list[Task]:
    """Load tasks from a ``.py`` file, a ``.jsonl`` file, a directory, or a suite selector.

    A spec that is not an existing path and contains ``:`` (or is a bare suite name such as
    ``kernelbench``) is a selector, resolved with :func:`resolve_suite` against ``source``.
    ``skipped``: for a directory, collect the files that do not load instead of failing
    (:func:`load_task_dir`).
    """
    text = os.fspath(spec)
    p = Path(text)
    if not p.exists() and (":" in text or text.strip().lower() in SUITES):
        return resolve_suite(text, source)
    if p.is_dir():
        return load_task_dir(p, skipped)
    if p.is_file():
        if p.suffix == ".py":
            return [load_task_file(p)]
        if p.suffix == ".jsonl":
            return load_task_jsonl(p)
        raise TaskError(f"unsupported task file {p} (expected .py, .jsonl or a directory)")
    raise TaskError(f"no such task file or suite: {text}")


def _keys(task: Task) -> Iterable[str]:
    yield task.task_id
    yield task.name
    if task.level is not None and task.problem_id is not None:
        yield f"level{task.level}_{task.problem_id}"


def find_task(tasks: Iterable[Task], key: str) -> Task:
    """The one task whose task_id (``level1/19``), name (``19_ReLU``), ``level1_19`` form, or
    hash prefix (8+ hex chars) equals ``key``.  Exact id/name matches win over hash prefixes;
    no match or several distinct matches is a TaskError."""
    key = key.strip()
    pool = list(tasks)
    matches = [t for t in pool if key in _keys(t)]
    if not matches and len(key) >= 8 and re.fullmatch(r"[0-9a-fA-F]+", key):
        matches = [t for t in pool if t.hash.startswith(key.lower())]
    unique = list(dict.fromkeys(matches))
    if not unique:
        raise TaskError(f"no task matches {key!r} (tried task id, name, levelN_M, hash prefix)")
    if len(unique) > 1:
        shown = ", ".join(f"{t.task_id} ({t.origin or t.name})" for t in unique[:5])
        more = f" and {len(unique) - 5} more" if len(unique) > 5 else ""
        raise TaskError(f"task key {key!r} is ambiguous: {shown}{more}")
    return unique[0]
