"""Unit tier: a GRPO run that collapses into answers without code is noticed, with the step it began
(cudal1.train.stages.collapse), reported in metrics.jsonl and the summary, and can end the run; prompts
are drawn afresh each fetch, so a pool that stops changing cannot hold a run on one prompt."""

from __future__ import annotations

import json

import pytest

from cudal1.train import smoke
from cudal1.train.stages.collapse import CollapseWatch


def _feed(watch: CollapseWatch, shares: list[float], rollouts: int = 16) -> list:
    found = []
    for step, share in enumerate(shares, start=1):
        bad = round(share * rollouts)
        hit = watch.update(step, {"format": bad, "ok": rollouts - bad})
        if hit is not None:
            found.append(hit)
    return found


def test_a_streak_of_format_failures_is_reported_once_with_the_step_it_began():
    watch = CollapseWatch(share=0.9, steps=3)
    found = _feed(watch, [0.1, 0.2, 0.95, 1.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0])
    assert len(found) == 1  # the 3-7 blip (two steps) is not a collapse; 6-8 is, reported at step 8 only
    assert (found[0].began_at, found[0].detected_at) == (6, 8) and found[0].share == 1.0
    assert watch.current is not None and watch.current.rollouts == 5 * 16  # kept current while it lasts
    assert watch.reported == [watch.current] and watch.current.status == "ongoing"
    assert "from step 6" in watch.current.message()


def test_recovery_is_recorded_and_a_new_streak_is_reported_again():
    watch = CollapseWatch(share=0.9, steps=2)
    found = _feed(watch, [1.0, 1.0, 1.0, 0.25, 0.0, 1.0, 0.9375])
    assert [(c.began_at, c.detected_at) for c in found] == [(1, 2), (6, 7)]
    first, second = watch.reported
    assert first.recovered_at == 4 and first.status == "recovered at step 4"
    assert first.share == 1.0 and first.rollouts == 48
    assert second is watch.current and second.began_at == 6 and second.share == pytest.approx((16 + 15) / 32)
    assert first.to_dict()["status"] == "recovered at step 4"


def test_the_watch_can_be_off_and_ignores_steps_without_rollouts():
    off = CollapseWatch(steps=0)
    assert _feed(off, [1.0] * 10) == [] and off.reported == []
    watch = CollapseWatch(share=0.5, steps=2)
    assert watch.update(1, {}) is None and watch.update(2, {"format": 4}) is None
    assert watch.update(3, {"format": 3, "compile_error": 1}) is not None  # 2 collapsed steps in a row
    with pytest.raises(ValueError):
        CollapseWatch(share=0.0)


def test_judge_reward_metrics_carry_the_collapse():
    pytest.importorskip("trl")
    from cudal1.train.config import load_config
    from cudal1.train.stages.grpo import JudgeReward

    class Judge:
        evaluated = 0

        def __init__(self):
            self.counts = {}

        def drain_counts(self):
            out, self.counts = self.counts, {}
            return out

    judge = Judge()
    reward = JudgeReward(judge, None, load_config("grpo", "smoke").reward, None, watch=CollapseWatch(0.9, 2))
    lines = []
    for step, counts in enumerate([{"ok": 8, "format": 8}, {"format": 16}, {"format": 16}, {"format": 15, "ok": 1}], 1):
        judge.counts = counts
        lines.append(reward.metrics(step))
    assert [("collapse" in m) for m in lines] == [False, False, True, True]
    assert lines[2]["collapse"]["began_at"] == 2 and lines[3]["collapse"]["rollouts"] == 48
    assert lines[3]["judged"] == {"format": 15, "ok": 1}
    assert [c.began_at for c in reward.watch.reported] == [2]  # what the run's summary lists


def test_config_checks_the_collapse_settings():
    from cudal1.config import ConfigError
    from cudal1.train.config import load_config

    assert load_config("grpo", "default").collapse_steps > 0  # on by default
    with pytest.raises(ConfigError, match="collapse_share"):
        load_config("grpo", "smoke", {"collapse_share": 1.5})


def test_prompts_are_drawn_afresh_each_fetch_alike_on_every_rank():
    """A pool that stops changing (every rollout a format failure, never judged) must not freeze a
    task's prompt: the smoke once sat at -2.0 for ten steps on one prompt it could not answer."""
    from cudal1.train.stages.contrast import ContrastivePrompts
    from cudal1.types import Exemplar

    task = smoke.smoke_task()
    pool = [Exemplar(code, speedup) for code, speedup in zip(smoke.VARIANTS.values(), (0.3, 0.8, 0.9, 3.0, 4.0, 4.2))]

    class Judge:  # a frozen pool
        def pool(self, task):
            return pool, []

    ranks = [ContrastivePrompts(Judge(), [task], exemplars=2, seed=3) for _ in range(2)]
    fetches = [[r.transform({"task": [task.task_id] * 4})["prompt"] for r in ranks] for _ in range(6)]
    for on_rank0, on_rank1 in fetches:
        assert on_rank0 == on_rank1  # every rank shows a group the same prompt
        assert all(p == on_rank0[0] for p in on_rank0)  # one prompt per task per fetch: a group shares it
    assert len({json.dumps(f[0][0]) for f in fetches}) > 1  # but not the same prompt every fetch
