"""Reading JSONL input files with one-line errors that name the file and line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator


class JsonlError(ValueError):
    """An unreadable file or a line that is not a JSON object."""


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line; ``JsonlError`` on the first bad one."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise JsonlError(f"cannot read {path}: {exc.strerror or exc}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise JsonlError(f"{path}:{n}: not JSON") from None
        if not isinstance(obj, dict):
            raise JsonlError(f"{path}:{n}: expected a JSON object")
        yield n, obj
