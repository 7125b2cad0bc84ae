"""Live metrics of an optimize run to an experiment tracker (``optimize --report-to``).

Contract: :func:`make_tracker` returns a :class:`TrackerLogger` for ``tensorboard``, ``wandb`` or
``mlflow`` when that package is installed, and raises :class:`~cudal1.extras.MissingExtra` (one line
naming what to install) otherwise; it is never used unless asked for.  The logger is an
``on_result`` callback for the search: after every verdict it logs, at step = verdicts so far,
``judged``, ``ok``, ``ok_rate``, ``tasks_with_ok``, ``geomean_best_so_far`` (1.0 for a task
without a verified candidate), and ``speedup`` of the verdict when it has one (a reference-round
verdict logs ``reference_ms`` instead and is never a best); :meth:`close`
logs the run's final ``geomean_best_speedup`` and closes the tracker.  A tracker failure
while logging is reported once through ``logging`` and never stops the search.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Protocol

from cudal1.extras import MissingExtra, require
from cudal1.report.aggregate import geomean

log = logging.getLogger(__name__)

TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}  # name -> package to install


TrackerUnavailable = MissingExtra  # the tracker's package is not installed (one exception type for every extra)


class Backend(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...
    def close(self) -> None: ...


class _TensorBoard:
    def __init__(self, out: Path, config: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(out / "tensorboard"))
        self.writer.add_text("config", repr(config))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)

    def close(self) -> None:
        self.writer.close()


class _Wandb:
    def __init__(self, out: Path, config: dict[str, Any]) -> None:
        import wandb

        self.run = wandb.init(project="cudal1", dir=str(out), config=config)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


class _Mlflow:
    def __init__(self, out: Path, config: dict[str, Any]) -> None:
        import mlflow

        self.mlflow = mlflow
        self.run = mlflow.start_run()
        mlflow.log_params({k: str(v)[:250] for k, v in config.items()})

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics(metrics, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


_BACKENDS: dict[str, Callable[[Path, dict[str, Any]], Backend]] = {
    "tensorboard": _TensorBoard, "wandb": _Wandb, "mlflow": _Mlflow}


def check_tracker(name: str) -> None:
    """ValueError for an unknown tracker; MissingExtra unless its package is installed."""
    if name not in TRACKERS:
        raise ValueError(f"unknown tracker {name!r}; known: {', '.join(TRACKERS)}")
    require(f"--report-to {name}", TRACKERS[name])


class TrackerLogger:
    """``on_result`` callback that keeps running figures and logs them to a backend."""

    def __init__(self, backend: Backend, anchors: set[str] | None = None) -> None:
        self.backend = backend
        self.anchors = anchors or set()  # the reference rounds' candidate hashes: never a "best"
        self.judged = self.ok = 0
        self.best: dict[str, float | None] = {}
        self._failed = False

    def __call__(self, result: Any) -> None:
        self.judged += 1
        key = result.task_hash or result.task_name
        self.best.setdefault(key, None)
        metrics: dict[str, float] = {}
        if result.candidate_hash in self.anchors:
            metrics["reference_ms"] = float(result.reference_ms or 0.0)
        elif getattr(result.status, "value", result.status) == "ok" and result.speedup:
            self.ok += 1
            metrics["speedup"] = float(result.speedup)
            if "degenerate_task" not in result.flags:
                self.best[key] = max(self.best[key] or 0.0, float(result.speedup))
        metrics.update(self.figures())
        self._log(metrics)

    def figures(self) -> dict[str, float]:
        return {"judged": float(self.judged), "ok": float(self.ok), "ok_rate": self.ok / max(self.judged, 1),
                "tasks_with_ok": float(sum(1 for b in self.best.values() if b is not None)),
                "geomean_best_so_far": geomean([b if b and b > 1.0 else 1.0 for b in self.best.values()]) or 1.0}

    def _log(self, metrics: dict[str, float]) -> None:
        try:
            self.backend.log(metrics, self.judged)
        except Exception as exc:  # noqa: BLE001 - a tracker must never stop the search
            if not self._failed:
                log.warning("tracker logging failed: %s", exc)
            self._failed = True

    def close(self, summary: dict[str, Any] | None = None) -> None:
        final = (summary or {}).get("geomean_best_speedup")
        if final is not None:
            self._log({"geomean_best_speedup": float(final)})
        try:
            self.backend.close()
        except Exception as exc:  # noqa: BLE001
            log.warning("closing the tracker failed: %s", exc)


def make_tracker(name: str, out: str | Path, config: dict[str, Any], tasks: list[Any] = ()) -> TrackerLogger:
    """A logger for tracker ``name`` writing under ``out`` (TrackerUnavailable when not installed);
    ``tasks``: the run's tasks, whose reference-round verdicts are not candidates."""
    from cudal1.types import reference_candidate

    check_tracker(name)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return TrackerLogger(_BACKENDS[name](out, config), {reference_candidate(t).hash for t in tasks})
