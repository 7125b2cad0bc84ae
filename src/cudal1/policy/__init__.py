"""Policies: given prompts, return completions (see :mod:`cudal1.policy.base` for the contract).

Registered policies (``make_policy(name, **options)``):

=========  =================================================  ===================
name       what                                               extra
=========  =================================================  ===================
openai     any OpenAI-compatible chat endpoint                ``cudal1[llm]``
hf         a local transformers model directory               ``cudal1[train]``
vllm       a local model directory, offline vLLM generation   ``pip install vllm``
replay     candidates read back from a JSONL file             —
builtin    the no-LLM optimizer of verified rewrites          —
=========  =================================================  ===================

:func:`make_policy` is the one place a policy is made: it checks the configuration first
(:func:`~cudal1.policy.base.policy_problem`: one :class:`~cudal1.policy.base.PolicyError` line
naming the flag that fixes it) and then constructs the registered class.  Implementation modules
are imported only when their policy is made, so importing this package needs neither ``openai``
nor ``transformers`` nor torch.  Policies never import ``cudal1.harness``.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from cudal1.policy.base import (
    Policy,
    PolicyConfig,
    PolicyError,
    PoolEntry,
    PoolPrompt,
    Proposal,
    declined_completion,
    error_completion,
    policy_problem,
    resolve_config,
    wrap_code,
)

# name -> "module:Class"; the module is imported lazily by make_policy.
POLICIES: dict[str, str] = {
    "openai": "cudal1.policy.openai_policy:OpenAIPolicy",
    "hf": "cudal1.policy.hf_policy:HFPolicy",
    "vllm": "cudal1.policy.vllm_policy:VLLMPolicy",
    "replay": "cudal1.policy.replay:ReplayPolicy",
    "builtin": "cudal1.policy.builtin:BuiltinPolicy",
}
_FIELDS = frozenset(f.name for f in dataclasses.fields(PolicyConfig))


def policy_class(name: str) -> type:
    """The class registered as ``name``; ValueError naming the known policies otherwise."""
    try:
        target = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"policy {name!r} is registered as {target!r}, but {module_name} has no {attr}") from None


def make_policy(name: str, config: PolicyConfig | None = None, **options: Any) -> Policy:
    """Check, then construct, the policy registered as ``name``.

    ``config`` is the base :class:`PolicyConfig`; ``options`` that are its fields override it, the
    rest go to the constructor as they are (replay's ``match``, builtin's ``workers``).  A
    configuration the policy cannot run with raises :class:`PolicyError` before anything is
    built; a missing optional dependency raises :class:`~cudal1.extras.MissingExtra`."""
    cls = policy_class(name)
    if POLICIES[name].startswith("cudal1.policy."):  # a policy of this package: one PolicyConfig
        cfg = resolve_config(config, {k: v for k, v in options.items() if k in _FIELDS}).replace(name=name)
        problem = policy_problem(cfg)
        if problem:
            raise PolicyError(problem)
        rest = {k: v for k, v in options.items() if k not in _FIELDS}
        if name == "builtin":
            return cls(device=cfg.device, passes=list(cfg.passes) or None, **rest)
        return cls(config=cfg, **rest)
    return cls(**({"config": config} if config is not None else {}), **options)


__all__ = ["POLICIES", "Policy", "PolicyConfig", "PolicyError", "PoolEntry", "PoolPrompt", "Proposal",
           "declined_completion", "error_completion", "make_policy", "policy_class", "policy_problem", "wrap_code"]
