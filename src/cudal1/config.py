"""Configuration: the one strict-dataclass config base, the judge's :class:`EvalConfig`, and a
run's ``config.yaml``.

Contract: every cudal1 config derives from :class:`Config` (frozen dataclass, documented fields,
coercion of YAML/CLI values, unknown keys are errors, ``to_dict``/``from_dict`` round-trip).
:class:`EvalConfig` adds YAML presets (``presets/``) and ``hash()``, which identifies the fields
that change verdicts (caching and resume).  Each run saves its resolved settings as
``OUT/config.yaml`` (:func:`write_config_file`), one section per config (``judge``, ``search``,
``policy`` ...), and :func:`read_config_file` reads that same file back (``--config``).  Env
vars are only for paths (``CUDAL1_CACHE_DIR``); everything else is a field here or a CLI flag.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from cudal1.tolerances import TOLERANCES
from cudal1.types import content_hash

C = TypeVar("C", bound="Config")


class ConfigError(ValueError):
    """Bad configuration: unknown key, bad value or unknown preset."""


# ---- the config base ----------------------------------------------------------------------------
#
# Every cudal1 configuration is a frozen dataclass deriving from :class:`Config`.  The base gives
# them one loader and one writer, so a subclass only declares fields (with a comment each: the
# help text) and, when needed, a ``validate`` method.  Usage:
#
#     @dataclass(frozen=True)
#     class MyConfig(Config):
#         SECTION = "my"                       # its section in config.yaml, its name in messages
#         steps: int = 10                      # optimizer steps
#         inner: OtherConfig = field(default_factory=OtherConfig)   # nested: a mapping in YAML
#
#         def validate(self) -> None:          # after coercion; raise ConfigError
#             if self.steps < 1:
#                 raise ConfigError("my.steps must be at least 1")
#
#     MyConfig.from_yaml("my.yaml"); MyConfig.from_dict({"steps": "20", "inner": {...}})
#     cfg.replace(steps=None, **{"inner.x": 3})   # None = "flag not given"; dotted keys reach nested fields
#     cfg.to_dict()                              # plain YAML/JSON-ready values, nested included


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """``value`` as the type ``hint`` (YAML and CLI strings included), or one ConfigError."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or hint is object:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        errors = []
        for a in inner:
            try:
                return _coerce(value, a, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(inner) == 1 else f"{where}: expected {_type_name(hint)}, got {value!r}")
    if origin is typing.Literal:
        if value in args:
            return value
        raise ConfigError(f"{where} must be one of {', '.join(map(str, args))}, not {value!r}")
    if isinstance(hint, type) and issubclass(hint, Config):
        if isinstance(value, hint):
            return value
        if isinstance(value, dict):
            return hint.from_dict(value, where)
        raise ConfigError(f"{where}: expected a mapping, got {value!r}")
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _BOOLS:
            return _BOOLS[value.strip().lower()]
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads 1e-5 (no dot) as a string
            try:
                return float(value.strip())
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    if origin in (list, tuple) or hint in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        item = args[0] if args and (origin is list or (len(args) == 2 and args[1] is Ellipsis)) else Any
        items = [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if (origin or hint) is tuple else items
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    return value


_BOOLS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _plain(value: Any) -> Any:
    """``value`` with configs, tuples and nested containers as plain YAML/JSON values."""
    if isinstance(value, Config):
        return value._values()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class Config:
    """Base of every cudal1 configuration (see the usage note above).

    Contract: construction (directly, :meth:`from_dict`, :meth:`from_yaml` or :meth:`replace`)
    coerces every field to its annotated type (``3`` for a float field becomes ``3.0``; strings
    from YAML or the command line become numbers and booleans; mappings become nested configs)
    and then runs :meth:`validate`; a wrong type, an unknown key at any depth or a bad value is
    one :class:`ConfigError` that names the key.  :meth:`to_dict` gives plain values that
    :meth:`from_dict` accepts back (``from_dict(c.to_dict()) == c``).  Keys in ``RENAMED`` (old
    name -> new name) are still read, so configs saved by older versions load.
    """

    SECTION: ClassVar[str] = "config"  # name of the section in a run's config.yaml and in messages
    RENAMED: ClassVar[dict[str, str]] = {}  # old key -> current key, still accepted when reading

    def __post_init__(self) -> None:
        hints = _hints(type(self))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            coerced = _coerce(value, hints.get(f.name, Any), f"{self.SECTION}.{f.name}")
            if coerced is not value:
                object.__setattr__(self, f.name, coerced)
        self.validate()

    def validate(self) -> None:
        """Check values after coercion; raise :class:`ConfigError`.  Subclasses override it."""

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_dict(cls: type[C], data: Mapping[str, Any], where: str | None = None) -> C:
        """A config from a mapping (nested mappings for nested configs); unknown keys are errors."""
        where = where or cls.SECTION
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
        data = {cls.RENAMED.get(k, k): v for k, v in data.items()}
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(known), key=str)
        if unknown:
            raise ConfigError(f"unknown {where} key(s): {', '.join(map(str, unknown))}; known: {', '.join(known)}")
        hints = _hints(cls)
        values = {k: _coerce(v, hints.get(k, Any), f"{where}.{k}") for k, v in data.items()}
        try:
            return cls(**values)
        except ConfigError:
            raise
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: {exc}") from None

    @classmethod
    def from_yaml(cls: type[C], path: str | os.PathLike[str], section: str | None = None) -> C:
        """A config from a YAML file: its top-level mapping, or its ``section`` mapping when the
        file is a run's ``config.yaml`` (see :func:`read_config_file`)."""
        data = read_yaml_mapping(path)
        if section is not None:
            data = data.get(section) or {}
        return cls.from_dict(data)

    def replace(self: C, **changes: Any) -> C:
        """A copy with ``changes`` applied and validated.  ``None`` means "not given" and changes
        nothing (CLI flags); a dotted key (``"reward.clip"``) reaches a nested config's field."""
        data = self._values()
        for key, value in changes.items():
            if value is None:
                continue
            node = data
            *parents, leaf = key.split(".")
            for p in parents:
                if not isinstance(node.get(p), dict):
                    raise ConfigError(f"unknown {self.SECTION} key {key!r}")
                node = node[p]
            node[leaf] = _plain(value)
        return type(self).from_dict(data)

    # ---- identity -----------------------------------------------------------------------
    def _values(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain YAML/JSON values (nested configs as mappings, tuples as lists).
        A subclass holding a secret overrides this to leave it out; :meth:`replace` does not
        go through it."""
        return self._values()

    def identity(self) -> dict[str, Any]:
        """The fields that change what a run produces (default: all).  A resumed run whose
        identity differs from the recorded one is a different run (:func:`config_changes`)."""
        return self.to_dict()

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=False)


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


# The sampling temperature every policy and training stage uses unless told otherwise (the
# exemplar selection's softmax temperature is another knob: ``tau``).
SAMPLING_TEMPERATURE = 1.0


@dataclass(frozen=True)
class EvalConfig(Config):
    """How the judge evaluates a candidate.  Field comments are the help text; the ``judge``
    section of a run's ``config.yaml``."""

    SECTION = "judge"

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
    flush_l2: bool = True
    timing_figure: str = (
        "gpu"  # what the speedup compares: gpu (device time, host latency excluded) or host (host-inclusive)
    )
    timing_block: int = 5  # timed calls per block; reference and candidate blocks alternate in random order
    confine_candidates: bool = True  # run each candidate's process unprivileged and confined where the OS allows
    cpu_binding: bool = True  # CPU clock, one job at a time: both processes' main threads on one CPU, their
    # OpenMP workers on the others, as OpenMP's proc_bind (docs/harness.md: CIs half as wide on 2 cores)
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
    profile: str = "off"  # off | cupti: profile both programs once after timing (information only; docs/harness.md)
    baseline_cache: bool = True  # baselines of one task share a persistent torch.compile/Triton cache (each
    # mode compiles once per machine, later modes reuse its kernels); false: a fresh cache per baseline job
    compile_off_lease: bool = True  # on a GPU, compiling (torch.compile's graphs, Triton's kernels) gives the GPU's
    # lease back (phase compile_cpu): Inductor's own GPU steps take it again, and a candidate's Triton autotuner
    # times its choices under the exclusive lease (docs/harness.md, "Compiling off the lease")
    autotune_off_lease: bool = True  # with compile_off_lease, an autotuning compile (max-autotune, coordinate
    # descent) runs off the lease too, its timings and random example inputs taking it back (a baseline's:
    # exclusive); false, or a torch whose autotuning steps cudal1 does not know: it keeps its lease, giving it
    # back only while it waits for compiles elsewhere
    first_call_lease: str = "choosers"  # with compile_off_lease on a GPU, the lease a candidate's first call holds:
    # choosers: its phase's (shared), exclusive only while a choice is made by timing (a run-time chooser on in
    # construct or the first call: cuDNN's benchmark mode, TunableOp's tuning; an autotuner's timings; the GPU
    # steps of a compile inside it); exclusive: the whole call (docs/harness.md, "Compiling off the lease")
    baseline_lease: str = "exclusive"  # on a GPU, the lease a torch.compile baseline's construct and correctness
    # hold: exclusive, the whole phases (every choice its compile and first call make is made alone); choosers,
    # with compile_off_lease, a candidate's rule under first_call_lease (shared, exclusive only while a choice is
    # made by timing), so other workers' GPU phases run beside the rest of its first call (stays off until its GPU
    # test passes on an H200 again: its one failure fits a judge fault fixed since; docs/harness.md)
    lease_order: str = "any"  # who gets the lease first among its waiters: any (flock's: none; one waiting for it
    # exclusive waits until no shared holder is left, new ones coming meanwhile); choices-first (a waiter for it
    # exclusive to make a choice by timing, an autotuning compile's steps say, stops new holders until it is
    # served; harness/lease.py; off by default: its first GPU A/B rejected one honest candidate, 24 verdicts since
    # did not, cause unknown; docs/harness.md)

    def validate(self) -> None:
        # the base has coerced types: 30 (YAML) and 30.0 (CLI) hash alike
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"device must be auto, cpu or cuda, not {self.device!r}")
        if self.profile not in ("off", "cupti"):
            raise ConfigError(f"profile must be off or cupti, not {self.profile!r} (ncu runs outside the judge)")
        if self.math_mode not in ("strict", "torch-default"):
            raise ConfigError(f"math_mode must be strict or torch-default, not {self.math_mode!r}")
        if self.tolerance not in TOLERANCES:
            raise ConfigError(f"unknown tolerance preset {self.tolerance!r}; known: {', '.join(TOLERANCES)}")
        if not 1 <= self.correctness_trials <= 100000:
            raise ConfigError("correctness_trials must be between 1 and 100000")
        if self.timing_trials < 1 or self.min_timing_trials < 1:
            raise ConfigError("timing trial counts must be positive")
        if self.first_call_lease not in ("choosers", "exclusive"):
            raise ConfigError(f"first_call_lease must be choosers or exclusive, not {self.first_call_lease!r}")
        if self.baseline_lease not in ("choosers", "exclusive"):
            raise ConfigError(f"baseline_lease must be choosers or exclusive, not {self.baseline_lease!r}")
        if self.lease_order not in ("any", "choices-first"):
            raise ConfigError(f"lease_order must be any or choices-first, not {self.lease_order!r}")
        if self.timing_figure not in ("gpu", "host"):
            raise ConfigError(f"timing_figure must be gpu or host, not {self.timing_figure!r}")
        if not 1 <= self.timing_block <= 1000:
            raise ConfigError("timing_block must be between 1 and 1000")
        if not 1 <= self.workers_per_gpu <= 8:
            raise ConfigError("workers_per_gpu must be between 1 and 8")
        for name in ("timeout_s", "build_timeout_s", "setup_timeout_s", "timing_budget_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")

    # ---- construction (from_dict, from_yaml, replace, to_dict: the Config base) --------------
    @classmethod
    def preset(cls, name: str) -> "EvalConfig":
        """A packaged preset (``default``, ``kernelbench-v0``, ``fast``, ``thorough``)."""
        from importlib import resources

        folder = resources.files("cudal1") / "presets"
        ref = folder / f"{name}.yaml"
        if not ref.is_file():
            known = sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))
            raise ConfigError(f"unknown preset {name!r}; known: {', '.join(known)}")
        with resources.as_file(ref) as p:
            return cls.from_yaml(p)

    # ---- identity -----------------------------------------------------------------------
    def identity(self) -> dict[str, Any]:
        """The fields that change verdicts or numbers (not paths, worker counts or hard limits)."""
        # Hard limits are left out: they decide nothing about a run that finishes in time, and a
        # resumed run with another --timeout must find what was recorded.
        ignore = {
            "cache_dir", "build_workers", "workers_per_gpu", "keep_samples", "input_seed", "timeout_s",
            "build_timeout_s", "setup_timeout_s", "confine_candidates", "baseline_cache", "cpu_binding",
            # where the lease is held; what is timed is unchanged
            "compile_off_lease", "autotune_off_lease", "first_call_lease", "baseline_lease", "lease_order",
            "profile",  # information only: no verdict or figure depends on it
        }
        return {k: v for k, v in self.to_dict().items() if k not in ignore}

    def hash(self) -> str:
        """Hash of :meth:`identity`: the key of verdicts in the run store and the build cache."""
        return content_hash("config", json.dumps(self.identity(), sort_keys=True))[:16]

    def cache_root(self) -> Path:
        root = self.cache_dir or os.environ.get("CUDAL1_CACHE_DIR") or "~/.cache/cudal1"
        return Path(root).expanduser()


# ---- a run's config file ------------------------------------------------------------------------

CONFIG_FILE = "config.yaml"
RECORD_SECTION = "run"  # what a run records about itself (target, device, version): never read back as settings
# What training runs of cudal1 0.1 wrote beside their sections instead of a ``run`` record (skipped, like it)
LEGACY_RECORD_KEYS = ("cudal1", "stage", "smoke", "processes", "args")


def read_config_file(
    path: str | os.PathLike[str], sections: Iterable[str], flat: str | None = "judge"
) -> dict[str, dict[str, Any]]:
    """The settings sections of a config file, ``{section: mapping}``, for a command that reads
    ``sections``.  This is the format every run writes as ``OUT/config.yaml``
    (:func:`write_config_file`), so feeding a run's saved file back reproduces its settings.  A
    file without any section name is the ``flat`` section on its own (a plain judge config file);
    the ``run`` section is skipped; a section the command does not read is one ConfigError.  Every
    command reads its settings through this function, ``cudal1 train`` too (sections ``judge`` and
    its stage's)."""
    data = read_yaml_mapping(path)
    known = list(sections)
    records = (RECORD_SECTION, *LEGACY_RECORD_KEYS)
    named = [k for k in data if k in known or k == RECORD_SECTION]
    if flat is not None and not named:
        return {flat: data}
    unknown = [str(k) for k in data if k not in known and k not in records]
    if unknown:
        raise ConfigError(
            f"{path}: unknown section(s) {', '.join(unknown)} for this command; known: {', '.join(known)}"
        )
    out: dict[str, dict[str, Any]] = {}
    for name in known:
        value = data.get(name)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: section {name} must be a mapping")
        out[name] = value
    return out


def write_config_file(out: str | os.PathLike[str], **sections: Any) -> dict[str, Any]:
    """Write ``OUT/config.yaml``: the fully resolved configuration of a run, one mapping per
    section (configs through ``to_dict``, others as given), plus the ``run`` record when given.
    Never pass secrets.  Returns what was written; a resumed run rewrites it."""
    import yaml

    resolved = {name: value.to_dict() if isinstance(value, Config) else _plain(value)  # to_dict leaves secrets out
                for name, value in sections.items() if value is not None}
    Path(out).mkdir(parents=True, exist_ok=True)
    Path(out, CONFIG_FILE).write_text(yaml.safe_dump(resolved, sort_keys=False, default_flow_style=False))
    return resolved


def config_changes(saved: Mapping[str, Any] | None, current: Config) -> list[str]:
    """``"section.key: old -> new"`` for each field of ``current``'s identity that differs from a
    saved section (what a run's ``config.yaml`` holds); ``[]`` when nothing was saved.  A saved
    section this version cannot read counts as one change."""
    if saved is None:
        return []
    try:
        before = type(current).from_dict(saved).identity()
    except ConfigError as exc:
        return [f"{current.SECTION}: the saved settings do not load ({exc})"]
    now = current.identity()
    return [f"{current.SECTION}.{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in now if before.get(k) != now.get(k)]


def saved_config(out: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The ``config.yaml`` a run left in ``out`` (None when there is none)."""
    path = Path(out, CONFIG_FILE)
    return read_yaml_mapping(path) if path.is_file() else None


def keep_previous_config(out: str | os.PathLike[str]) -> Path | None:
    """Before a run records a second configuration in the same ``out``: keep the current
    ``config.yaml`` as ``config.N.yaml`` (N = 1, 2, ...); returns that path (None without one)."""
    path = Path(out, CONFIG_FILE)
    if not path.is_file():
        return None
    n = 1
    while Path(out, f"config.{n}.yaml").exists():
        n += 1
    kept = Path(out, f"config.{n}.yaml")
    path.replace(kept)
    return kept
