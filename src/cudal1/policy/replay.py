"""``replay`` policy: completions read back from a JSONL file (audits, tests, reproducing runs).

File format: one JSON object per line (blank lines and lines starting with ``#`` are skipped):
``{"task": "...", "code": "..."}``, or ``"response"``/``"text"`` holding a full model response
instead of (or as well as) bare ``code``; a full response is replayed verbatim, bare code is
wrapped in a ```` ```python ```` fence (unless it already has a fence) so the response parser finds
it.  Other keys are kept in ``Completion.meta["record"]``.  Malformed lines are errors at load time.

Matching (the default, :func:`default_match`): a record belongs to a prompt when its ``task``

- equals ``prompt.task_name`` or ``prompt.task_hash``, or
- is a prefix (8+ characters) of ``prompt.task_hash``, or
- is a task id ``levelL/P`` and ``prompt.task_name`` is ``P`` or starts with ``P_`` (KernelBench file
  names such as ``19_ReLU``).  The level cannot be checked against a prompt, so files mixing
  levels should use names or hashes; a ``task_hash`` key on the record, when present, must also be
  a prefix of ``prompt.task_hash``.

Pass ``match=callable(prompt, record) -> bool`` to replace the rule.  For each prompt the policy
hands out the next unused matching records in file order (each record is used once across all
calls); when none is left the completion is an error, ``replay exhausted``.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any, Callable

from cudal1.policy.base import PolicyConfig, declined_completion, error_completion, resolve_config, wrap_code
from cudal1.types import Completion, Prompt

Record = dict[str, Any]
_TASK_ID = re.compile(r"^level\d+/(\d+)$")


def default_match(prompt: Prompt, record: Record) -> bool:
    """The default record-to-prompt rule (see the module docstring)."""
    task = str(record.get("task", ""))
    record_hash = str(record.get("task_hash", "") or "")
    if record_hash and not prompt.task_hash.startswith(record_hash):
        return False
    if not task:
        return bool(record_hash)
    if task in (prompt.task_name, prompt.task_hash):
        return True
    if len(task) >= 8 and prompt.task_hash.startswith(task):
        return True
    m = _TASK_ID.match(task)
    return bool(m) and (prompt.task_name == m.group(1) or prompt.task_name.startswith(m.group(1) + "_"))


def load_records(path: str | Path) -> list[Record]:
    """The records of a replay file; ValueError naming the line for anything malformed."""
    records = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ValueError(f"cannot read replay file {path}: {exc}") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{path}:{lineno}: not JSON: {exc}") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{lineno}: expected a JSON object")
        if not (record.get("task") or record.get("task_hash")):
            raise ValueError(f"{path}:{lineno}: record has no 'task'")
        if not any(isinstance(record.get(k), str) for k in ("code", "response", "text")):
            raise ValueError(f"{path}:{lineno}: record needs a string 'code', 'response' or 'text'")
        records.append(record | {"_line": lineno})
    return records


class ReplayPolicy:
    """Replays recorded candidates (see the module docstring)."""

    name = "replay"

    def __init__(
        self,
        config: PolicyConfig | None = None,
        *,
        records: list[Record] | None = None,
        match: Callable[[Prompt, Record], bool] | None = None,
        **options: Any,
    ) -> None:
        self.config = resolve_config(config, options)
        if records is None:
            if not self.config.replay_path:
                raise ValueError("the replay policy needs a replay_path (a JSONL of task/code records)")
            records = load_records(self.config.replay_path)
        self.records = records
        self.match = match or default_match
        self.model = Path(self.config.replay_path).name if self.config.replay_path else "records"
        self._used = [False] * len(records)
        self._lock = threading.Lock()

    def generate(self, prompts: list[Prompt], n: int | None = None) -> list[list[Completion]]:
        """For each prompt, its next ``n`` unused matching records (errors once exhausted)."""
        n = self.config.n if n is None else n
        with self._lock:  # records are handed out once, also across concurrent calls
            return [[self._next(prompt) for _ in range(n)] for prompt in prompts]

    def remaining(self) -> int:
        """Records not yet handed out."""
        return self._used.count(False)

    def close(self) -> None:
        pass

    def _next(self, prompt: Prompt) -> Completion:
        for i, record in enumerate(self.records):
            if self._used[i]:
                continue
            try:
                matched = self.match(prompt, record)
            except Exception as exc:  # noqa: BLE001 - a broken custom rule fails the sample, not the run
                return error_completion(self.name, f"replay match failed: {type(exc).__name__}: {exc}", self.model)
            if matched:
                self._used[i] = True
                return self._completion(record)
        return declined_completion(
            self.name, f"replay exhausted: no unused record for task {prompt.task_name!r}", self.model
        )

    def _completion(self, record: Record) -> Completion:
        response = record.get("response") or record.get("text")
        text = response if isinstance(response, str) and response else wrap_code(str(record.get("code", "")))
        meta = {"record": {k: v for k, v in record.items() if k not in ("code", "response", "text")}}
        return Completion(text=text, policy=self.name, model=self.model, meta=meta)
