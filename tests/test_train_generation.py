"""Unit tier: how offline generation (self-supervised rounds, evaluation) splits its work over
training processes and picks its engine (cudal1.train.generation, cudal1.policy.vllm_policy)."""

from __future__ import annotations

import importlib.util
import itertools

import pytest

from cudal1.train.generation import GenerationSettings, engine_tp, shard, use_vllm


def test_each_rank_generates_and_judges_its_own_block():
    parts = [shard(8, r, 2) for r in range(2)]
    assert [list(p.generate) for p in parts] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [p.judge for p in parts] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_an_engine_group_generates_one_block_and_its_ranks_judge_alternate_items():
    parts = [shard(10, r, 4, tp=2) for r in range(4)]
    assert [list(p.generate) for p in parts] == [list(range(5))] * 2 + [list(range(5, 10))] * 2
    assert [p.judge for p in parts] == [[0, 2, 4], [1, 3], [5, 7, 9], [6, 8]]
    assert [p.group for p in parts] == [0, 0, 1, 1] and parts[0].groups == 2


@pytest.mark.parametrize(
    "n, world, tp",
    [(n, w, t) for n, w, t in itertools.product((0, 1, 7, 64, 250), (1, 2, 3, 8), (1, 2, 4)) if w % t == 0],
)
def test_every_item_is_generated_by_one_group_and_judged_once(n, world, tp):
    parts = [shard(n, r, world, tp) for r in range(world)]
    judged = sorted(i for p in parts for i in p.judge)
    assert judged == list(range(n))
    blocks = {p.group: tuple(p.generate) for p in parts}
    assert all(tuple(p.generate) == blocks[p.group] for p in parts)  # one block per engine group
    assert sorted(i for b in blocks.values() for i in b) == list(range(n))
    assert max(map(len, blocks.values())) - min(map(len, blocks.values())) <= 1  # balanced


def test_bad_sharding_is_refused():
    with pytest.raises(ValueError, match="tensor parallel size 4"):
        shard(8, 0, 6, tp=4)
    with pytest.raises(ValueError):
        shard(8, 2, 2)


def test_engine_choice():
    assert engine_tp(GenerationSettings(tensor_parallel_size=4), world=8) == 4
    assert engine_tp(GenerationSettings(), world=8) == 1  # one GPU per rank under several processes
    assert not use_vllm("transformers")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_without_vllm_auto_means_transformers_and_vllm_is_refused():
    from cudal1.extras import MissingExtra

    assert not use_vllm("auto")
    with pytest.raises(MissingExtra, match="pip install vllm"):
        use_vllm("vllm")
