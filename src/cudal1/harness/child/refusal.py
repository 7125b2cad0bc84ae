"""How the candidate's process ends its protocol early: a :class:`Refusal` carries a verdict that
can only make the candidate's own verdict worse (never ``ok``) back to the reference worker."""

from __future__ import annotations

import traceback
from typing import Any

from cudal1.harness.faults import is_cuda_fault, is_out_of_memory


class Refusal(Exception):
    """Ends the candidate's protocol with a (never ``ok``) verdict for the reference worker."""

    def __init__(self, status: str, message: str, *flags: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.message, self.flags, self.extra = status, message, list(flags), extra

    def as_reply(self) -> dict[str, Any]:
        return {"verdict": {"status": self.status, "message": self.message, "flags": self.flags, **self.extra}}


def runtime_refusal(exc: BaseException, where: str) -> Refusal:
    text = f"{type(exc).__name__}: {exc}"
    flags = ["oom"] if is_out_of_memory(exc) else []
    if is_cuda_fault(text):
        flags.append("illegal_memory_access")
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-6:])
    return Refusal("runtime_error", f"{where}: {text[:2000]}", *flags, traceback=tb[-4000:])
