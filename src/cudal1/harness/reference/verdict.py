"""The clean side's early end of a job: a status, a message and flags."""

from __future__ import annotations

from typing import Any


class Verdict(Exception):
    """Ends the reference worker's protocol early with a status (a ``Status`` value) and flags."""

    def __init__(self, status: str, message: str, *flags: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.message, self.flags, self.extra = status, message, list(flags), extra
