"""Policies: given prompts, return completions (see :mod:`cudal1.policy.base` for the contract).

Registered policies (``make_policy(name, **options)``):

=========  =================================================  ===================
name       what                                               extra
=========  =================================================  ===================
openai     any OpenAI-compatible chat endpoint                ``cudal1[llm]``
hf         a local transformers model directory               ``cudal1[train]``
replay     candidates read back from a JSONL file             —
builtin    the no-LLM optimizer of verified rewrites          —
=========  =================================================  ===================

Implementation modules are imported only when their policy is made, so importing this package
needs neither ``openai`` nor ``transformers`` nor torch.  Policies never import ``cudal1.harness``.
"""

from __future__ import annotations

import importlib
from typing import Any

from cudal1.policy.base import (Policy, PolicyConfig, PoolEntry, PoolPrompt, Proposal, declined_completion,
                                error_completion, wrap_code)

# name -> "module:Class"; the module is imported lazily by make_policy.
POLICIES: dict[str, str] = {
    "openai": "cudal1.policy.openai_policy:OpenAIPolicy",
    "hf": "cudal1.policy.hf_policy:HFPolicy",
    "replay": "cudal1.policy.replay:ReplayPolicy",
    "builtin": "cudal1.policy.builtin:BuiltinPolicy",
}


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


def make_policy(name: str, **options: Any) -> Policy:
    """Construct the policy registered as ``name`` with keyword ``options``.

    For ``openai``, ``hf`` and ``replay`` the options are :class:`PolicyConfig` fields, optionally
    with ``config=PolicyConfig(...)`` as the base they override; unknown options are errors.
    ``builtin`` documents its own options.
    """
    return policy_class(name)(**options)


__all__ = ["POLICIES", "Policy", "PolicyConfig", "PoolEntry", "PoolPrompt", "Proposal", "declined_completion", "error_completion",
           "make_policy", "policy_class", "wrap_code"]
