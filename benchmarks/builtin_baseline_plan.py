"""Which baselines of ``benchmarks/builtin_kernelbench.py`` a task needs timed: two cost levers
that leave a task's figures where they were (on with ``--levers on``, the default).

- **The search's verdict stands in.**  The builtin policy proposes the reference under a
  torch.compile mode as a candidate of its own (a chain that is exactly that mode: the same
  ``torch.compile`` of the same forward).  Where the search judged that chain and it verified, the
  run already holds that program's verdict under the same judge; the baseline would time the same
  program again.  The task's row takes the search's verdict for the mode
  (:func:`builtin_figures.task_rows` already did that when no baseline was timed).  On the
  stride-5 run's 8 tasks the two read within 1% of each other for ``compile-default``.  Not for
  ``cudagraph``: the policy's replay clones its outputs (a user's program must), the baseline's
  does not, and the two read apart by up to 33%; that baseline is always timed.
- **Graphs that do not pay.**  The judge's GPU figure is the call's span on the device with the
  whole call enqueued behind the timer's gate, so host launch latency is already outside it.
  What CUDA-graph replay can still remove is the device's own gap between kernel launches; what it
  adds is the copy of every input into the graph's static buffers.  ``compile-reduce-overhead``
  and ``compile-max-autotune`` are ``compile-default`` and ``compile-max-autotune-no-cudagraphs``
  (the same Inductor kernels) replayed as a graph (:data:`cudal1.compile_modes.UNGRAPHED_TWIN`).
  So when CUDA-graph replay of the eager reference reads measurably below eager (the upper end of its 95% interval
  under 1.0), replaying Inductor's kernels, no more of them than eager launches, does not pay
  either, and those two modes are not timed: each would read below its sibling.  On the stride-5
  run's 8 tasks timed before this lever, CUDA-graph replay read below eager on all 8
  (0.50-0.99x, every interval under 1.0) and every graphed mode below its sibling (by 1.5-63%).
  Where ``cudagraph`` is not judged (a CPU, ``--modes`` without it) or failed, every mode is
  timed.

The graph modes are therefore timed after the others (:func:`phases`), once the task's
``cudagraph`` verdict is known.  A skipped mode is named with its reason in the task's row
(``mode_skipped``) and ``OUT/baseline_skips.json``; per-mode figures count the tasks it was timed
on (their ``n``).  ``--levers off`` times every mode of every task.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cudal1.compile_modes import COMPILE_MODES, CUDA_GRAPH, UNGRAPHED_TWIN

SKIPS = "baseline_skips.json"
DONE = "baselines_done.json"  # the tasks whose baselines have all run (a sorted list of task ids)


def phases(modes: list[str]) -> list[list[str]]:
    """``modes`` in the order they are timed: those the graph rule does not depend on, then the
    graphed compile modes (empty phases dropped)."""
    first = [m for m in modes if m not in UNGRAPHED_TWIN]
    return [p for p in (first, [m for m in modes if m in UNGRAPHED_TWIN]) if p]


#: The compile mode the builtin policy proposes in round 1 wherever torch.compile applies (on all
#: 39 stride-5 tasks, H200, 2026-12-05): its verdict stands in for the baseline (:func:`searched`).
SEARCHED_FIRST = ("compile-default",)


def ahead(modes: list[str]) -> list[str]:
    """The baseline modes timed in the search's first batch (``builtin_kernelbench.py
    --baselines-along``): the modes that need nothing of the search, those of the first phase
    (:func:`phases`) but :data:`SEARCHED_FIRST`.  A task whose search then judges one of them
    itself keeps the baseline (the row takes a baseline first); a task whose search did not judge
    :data:`SEARCHED_FIRST` has that baseline timed after its search, as before."""
    return [m for m in modes if m not in UNGRAPHED_TWIN and m not in SEARCHED_FIRST]


def searched(row: dict[str, Any], mode: str) -> bool:
    """``mode`` is a torch.compile mode, and the search judged the reference under it alone and
    that verdict verified."""
    return mode in COMPILE_MODES and any(chain == mode and status == "ok" for chain, status, _ in row["chains"])


def graphs_pay(row: dict[str, Any]) -> bool | None:
    """Whether CUDA-graph replay of the eager reference may beat eager on this task (the upper end
    of its speedup's 95% interval above 1.0); None when that replay has no verified verdict."""
    if row["mode_status"].get(CUDA_GRAPH) != "ok":
        return None
    ci = (row.get("mode_ci") or {}).get(CUDA_GRAPH)
    value = row["modes"].get(CUDA_GRAPH)
    if value is None:
        return None
    return (ci[1] if ci else value) > 1.0


def skip_reason(row: dict[str, Any], mode: str) -> str | None:
    """Why ``mode``'s baseline need not be timed for this task's row, or None when it must be."""
    if searched(row, mode):
        return "the search's own verdict of this mode stands in"
    if mode in UNGRAPHED_TWIN and graphs_pay(row) is False:
        ci = (row.get("mode_ci") or {}).get(CUDA_GRAPH)
        return (f"CUDA-graph replay of the reference read {row['modes'][CUDA_GRAPH]:.3f}x"
                + (f" (95% CI up to {ci[1]:.3f})" if ci else "")
                + f": graphs do not pay here, so this is {UNGRAPHED_TWIN[mode]} with a replay that does not pay")
    return None


def plan(rows: list[dict[str, Any]], modes: list[str]) -> tuple[list[tuple[str, str]], dict[str, dict[str, str]]]:
    """(task id, mode) pairs to time, mode by mode, and {task id: {mode: why it is not timed}}."""
    todo: list[tuple[str, str]] = []
    skipped: dict[str, dict[str, str]] = {}
    for mode in modes:
        for row in rows:
            why = skip_reason(row, mode)
            if why:
                skipped.setdefault(row["task"], {})[mode] = why
            else:
                todo.append((row["task"], mode))
    return todo, skipped


def load_skips(out: Path) -> dict[str, dict[str, str]]:
    path = out / SKIPS
    return json.loads(path.read_text()) if path.exists() else {}


def merge_skips(into: dict[str, dict[str, str]], skipped: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """``skipped``'s reasons added to ``into`` (changed in place and returned)."""
    for task, why in skipped.items():
        into.setdefault(task, {}).update(why)
    return into


def record_skips(out: Path, skipped: dict[str, dict[str, str]]) -> None:
    """Merge ``skipped`` into ``OUT/baseline_skips.json`` (written whole, then renamed)."""
    write_whole(out / SKIPS, json.dumps(merge_skips(load_skips(out), skipped), indent=1, sort_keys=True))


def write_whole(path: Path, text: str) -> None:
    """``text`` into ``path``, written whole beside it, then renamed over it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def load_done(out: Path) -> set[str]:
    path = out / DONE
    return set(json.loads(path.read_text())) if path.exists() else set()


def record_done(out: Path, task_ids: list[str]) -> None:
    """Add ``task_ids`` to ``OUT/baselines_done.json``: their baselines have all run (written
    whole, then renamed)."""
    write_whole(out / DONE, json.dumps(sorted(load_done(out) | set(task_ids)), indent=0))
