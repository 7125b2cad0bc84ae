"""Judge configuration: one frozen dataclass with documented fields, YAML presets, strict keys.

Contract: unknown keys are errors (:class:`ConfigError`), every field has a default, the resolved
config is saved with every run (``to_dict``), and ``hash()`` identifies it for caching and resume.
Env vars are only for paths (``CUDAL1_CACHE_DIR``); everything else is a field here or a CLI flag.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cudal1.types import content_hash


class ConfigError(ValueError):
    """Bad configuration: unknown key, bad value or unknown preset."""


# Correctness rules.  ``exact`` (the default) judges floating outputs against the reference run
# in float64 (see harness/numerics.py: "@exact" holds (factor, unused), "@floor:<dtype>" holds
# (floor relative to |exact|, absolute floor per element)); outputs it cannot judge fall back to
# its per-dtype (atol, rtol) rows, which are ``strict``'s.  The fixed presets compare with the
# fp32 reference under per-dtype (atol, rtol) only: ``kernelbench-v0`` is the 1e-2 that
# KernelBench's published numbers used, kept for comparability.
_STRICT = {
    "float64": (1e-7, 1e-7),
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (1e-2, 1e-2),
    "float8_e4m3fn": (1e-1, 1e-1),
    "float8_e5m2": (1e-1, 1e-1),
}
TOLERANCES: dict[str, dict[str, tuple[float, float]]] = {
    "exact": {
        **_STRICT,
        "@exact": (16.0, 0.0),
        "@floor:float32": (1e-5, 1e-8),
        "@floor:float16": (2e-3, 1e-5),
        "@floor:bfloat16": (1.6e-2, 1e-4),
    },
    "strict": dict(_STRICT),
    "kernelbench-v0": {
        "float64": (1e-2, 1e-2),
        "float32": (1e-2, 1e-2),
        "float16": (1e-2, 1e-2),
        "bfloat16": (1e-2, 1e-2),
        "float8_e4m3fn": (1e-1, 1e-1),
        "float8_e5m2": (1e-1, 1e-1),
    },
}


def from_mapping(cls: Any, data: dict[str, Any], what: str) -> Any:
    """``cls(**data)`` for a config dataclass, with unknown keys as one :class:`ConfigError`
    naming ``what`` and the known keys (every config of cudal1 is strict this way)."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown {what} key(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return cls(**data)


def read_yaml_mapping(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A YAML file's top-level mapping (an empty file is ``{}``); one ConfigError otherwise."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config {path} must be a mapping")
    return data


@dataclass(frozen=True)
class EvalConfig:
    """How the judge evaluates a candidate.  Field comments are the help text."""

    device: str = "auto"  # auto | cpu | cuda
    correctness_trials: int = 5  # fresh random inputs per trial (the paper used up to 1000)
    tolerance: str = "exact"  # correctness rule: exact (float64 answer) or a fixed table (strict, kernelbench-v0)
    math_mode: str = "strict"  # strict: TF32 off for matmul and cuDNN; torch-default: as torch ships
    seed: int = 42  # seed for constructing Model and ModelNew (KernelBench convention)
    input_seed: int | None = None  # secret per-run seed for inputs; None = drawn at random
    warmup_calls: int = 3  # untimed calls per model before timing (after compilation/autotune)
    timing_trials: int = 100  # maximum timed calls per model
    min_timing_trials: int = 10  # timed calls per model even for slow models
    timing_budget_s: float = 4.0  # target wall time of the timing phase (both models)
    recheck_fraction: float = 0.1  # share of timed candidate outputs re-checked (at least 2)
    flush_l2: bool = True  # overwrite a buffer larger than L2 before every timed call (both models); off: warm-cache timing
    poison_freed_memory: bool = True  # fill the allocator's free blocks with NaN between runs
    strict_speedup: float = 10.0  # speedups above this get a second, stricter verification pass
    static_guards: str = "all"  # "all", "none" or comma-separated names of static_guard.CHECKS
    bootstrap_samples: int = 1000  # resamples for the speedup's 95% confidence interval
    timeout_s: float = 120.0  # hard limit per phase (construct, correctness, timing)
    build_timeout_s: float = 900.0  # hard limit for importing/building the candidate
    setup_timeout_s: float = 120.0  # hard limit for worker start-up (CUDA init, reference import)
    build_workers: int = 0  # parallel CPU build processes; 0 = min(8, cpu count)
    workers_per_gpu: int = 1  # judge workers sharing one GPU; timing stays exclusive (the GPU lease)
    cache_dir: str = ""  # build cache root; "" = $CUDAL1_CACHE_DIR or ~/.cache/cudal1
    keep_samples: bool = True  # keep raw timing samples in results

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # 30 (YAML) and 30.0 (CLI) must hash alike
            value = getattr(self, f.name)
            if f.type in ("float", "float | None") and isinstance(value, int) and not isinstance(value, bool):
                object.__setattr__(self, f.name, float(value))
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"device must be auto, cpu or cuda, not {self.device!r}")
        if self.math_mode not in ("strict", "torch-default"):
            raise ConfigError(f"math_mode must be strict or torch-default, not {self.math_mode!r}")
        if self.tolerance not in TOLERANCES:
            raise ConfigError(f"unknown tolerance preset {self.tolerance!r}; known: {', '.join(TOLERANCES)}")
        if not 1 <= self.correctness_trials <= 100000:
            raise ConfigError("correctness_trials must be between 1 and 100000")
        if self.timing_trials < 1 or self.min_timing_trials < 1:
            raise ConfigError("timing trial counts must be positive")
        if not 1 <= self.workers_per_gpu <= 8:
            raise ConfigError("workers_per_gpu must be between 1 and 8")
        for name in ("timeout_s", "build_timeout_s", "setup_timeout_s", "timing_budget_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "EvalConfig":
        return from_mapping(cls, data, "config")

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> "EvalConfig":
        return cls.from_dict(read_yaml_mapping(path))

    @classmethod
    def preset(cls, name: str) -> "EvalConfig":
        """A packaged preset (``default``, ``kernelbench-v0``, ``fast``, ``thorough``)."""
        from importlib import resources

        ref = resources.files("cudal1") / "presets" / f"{name}.yaml"
        if not ref.is_file():
            raise ConfigError(f"unknown preset {name!r}")
        with resources.as_file(ref) as p:
            return cls.from_yaml(p)

    def replace(self, **changes: Any) -> "EvalConfig":
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    # ---- identity -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def hash(self) -> str:
        """Identity of the fields that change verdicts or numbers (not paths or worker counts)."""
        # Hard limits are left out: they decide nothing about a run that finishes in time, and a
        # resumed run with another --timeout must find what was recorded.
        ignore = {"cache_dir", "build_workers", "workers_per_gpu", "keep_samples", "input_seed", "timeout_s", "build_timeout_s", "setup_timeout_s"}
        data = {k: v for k, v in self.to_dict().items() if k not in ignore}
        return content_hash("config", json.dumps(data, sort_keys=True))[:16]

    def cache_root(self) -> Path:
        root = self.cache_dir or os.environ.get("CUDAL1_CACHE_DIR") or "~/.cache/cudal1"
        return Path(root).expanduser()


def write_run_config(out: str | os.PathLike[str], **sections: Any) -> dict[str, Any]:
    """``OUT/config.yaml``: the fully resolved configuration of a run, one mapping per section
    (``judge`` an :class:`EvalConfig`, others dataclasses with ``to_dict`` or plain mappings).
    Never pass secrets.  Returned as saved; a resumed run rewrites it."""
    import yaml

    resolved = {name: (value.to_dict() if hasattr(value, "to_dict") else value) for name, value in sections.items()}
    Path(out, "config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False, default_flow_style=False))
    return resolved
