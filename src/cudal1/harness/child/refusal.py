"""How the candidate's process ends its protocol early: a :class:`Refusal` carries a verdict that
can only make the candidate's own verdict worse (never ``ok``) back to the reference worker."""

from __future__ import annotations

from typing import Any

from cudal1.harness.faults import runtime_error_parts


class Refusal(Exception):
    """Ends the candidate's protocol with a (never ``ok``) verdict for the reference worker."""

    def __init__(self, status: str, message: str, *flags: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.message, self.flags, self.extra = status, message, list(flags), extra

    def as_reply(self) -> dict[str, Any]:
        return {"verdict": {"status": self.status, "message": self.message, "flags": self.flags, **self.extra}}


def runtime_refusal(exc: BaseException, where: str) -> Refusal:
    message, flags, tb = runtime_error_parts(exc, where)
    return Refusal("runtime_error", message, *flags, traceback=tb)
