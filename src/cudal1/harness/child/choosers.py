"""Run-time choosers in the candidate's process: library settings under which a call picks among
implementations by timing them on the GPU the first time it meets a shape (cuDNN's benchmark mode,
TunableOp's tuning), so that the choice, and the candidate's time with it, depends on what else
runs on the GPU meanwhile.

Contract: :func:`active` names the choosers on now.  :class:`Watch` brackets a request
``alone(True)`` / ``alone(False)`` (the reference worker holds the GPU's lease exclusive between
them) where one is on as the request starts, or from the moment one is turned on inside it, until
the request ends however it ends; the reference worker decides whether a request is watched (the
candidate's construction and its first call, ``EvalConfig.first_call_lease: choosers``).  Turning
one on is seen through the setters Python code reaches (:data:`SETTERS`: ``torch.backends.cudnn
.benchmark = True``, ``torch.backends.cudnn.flags(benchmark=True)``, ``torch.cuda.tunable.enable``
and ``tuning_enable``), wrapped by :meth:`Watch.install`, on the main thread only.  Known limits:
a chooser turned on from native code, or on another thread, is seen only at the start of the next
watched request; a program's own timing (CUDA events around alternatives) is not seen at all; a
shape first met after the watched requests is chosen under the phase's own lease.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable

# name -> whether it is on: each reads the setting itself (torch._C), not a Python mirror of it
_STATES: dict[str, Callable[[], bool]] = {
    "cudnn_benchmark": lambda: bool(_c("_get_cudnn_benchmark")()),
    "tunableop": lambda: bool(_c("_cuda_tunableop_is_enabled")()) and bool(_c("_cuda_tunableop_tuning_is_enabled")()),
}
# torch._C functions that turn a chooser on, as torch.backends.cudnn and torch.cuda.tunable call them
SETTERS = ("_set_cudnn_benchmark", "_cuda_tunableop_enable", "_cuda_tunableop_tuning_enable")
_MARK = "_cudal1_watches_choosers"


def _c(name: str) -> Callable[..., Any]:
    import torch

    return getattr(torch._C, name)


def active() -> list[str]:
    """The choosers on in this process now (a setting this torch lacks reads as off)."""
    on = []
    for name, state in _STATES.items():
        try:
            if state():
                on.append(name)
        except Exception:  # noqa: BLE001 - a CPU build has no TunableOp; a failing read is no chooser
            pass
    return on


class Watch:
    """Brackets watched requests ``alone`` where a chooser is on (see the module docstring)."""

    def __init__(self, alone: Callable[[bool], None]) -> None:
        self.alone = alone
        self.watching = False  # inside a watched request, on the main thread
        self.open = False  # its bracket is open
        self.lock = threading.Lock()

    def install(self) -> list[str]:
        """Wrap :data:`SETTERS` (and cuDNN's ``benchmark`` property, which holds the setter it was
        built with) so that turning a chooser on inside a watched request opens its bracket;
        returns the setters wrapped (none twice)."""
        import torch

        wrapped = []
        for name in SETTERS:
            inner = getattr(torch._C, name, None)
            if inner is None or getattr(inner, _MARK, False):
                continue
            setattr(torch._C, name, self._setter(inner))
            wrapped.append(name)
        prop = type(sys.modules.get("torch.backends.cudnn")).__dict__.get("benchmark")
        setter = getattr(prop, "setter", None)
        if setter is not None and not getattr(setter, _MARK, False):
            prop.setter = getattr(torch._C, "_set_cudnn_benchmark", setter)
        return wrapped

    def _setter(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        def setter(*args: Any, **kwargs: Any) -> Any:
            result = inner(*args, **kwargs)
            if self.watching and threading.current_thread() is threading.main_thread() and active():
                self._open()
            return result

        setattr(setter, _MARK, True)
        return setter

    def _open(self) -> None:
        with self.lock:
            if self.open:
                return
            self.open = True
        self.alone(True)

    def request(self, watched: bool) -> "_Request":
        """A context for one request: bracketed from its start where a chooser is on already,
        else from the moment one is turned on inside it (``watched`` false: not at all)."""
        return _Request(self, watched)


class _Request:
    def __init__(self, watch: Watch, watched: bool) -> None:
        self.watch, self.watched = watch, watched

    def __enter__(self) -> None:
        if not self.watched:
            return
        self.watch.watching = True
        if active():
            self.watch._open()

    def __exit__(self, *exc: Any) -> None:
        if not self.watched:
            return
        watch = self.watch
        watch.watching = False
        with watch.lock:
            was_open, watch.open = watch.open, False
        if was_open:
            watch.alone(False)
