"""How the optimizer searches: :class:`SearchConfig`, the ``search`` section of a run's config."""

from __future__ import annotations

from dataclasses import dataclass

from cudal1.config import Config, ConfigError

# Fields that only say when to stop: a resumed run may change them freely (more rounds, a longer
# budget) without changing what was searched so far.
STOPPING = ("rounds", "budget_minutes", "max_evaluations")


@dataclass(frozen=True)
class SearchConfig(Config):
    """How the optimizer searches.  Field comments are the help text; the defaults here are the
    only statement of them (the CLI's flags default to "not given" and override these)."""

    SECTION = "search"
    RENAMED = {"temperature": "tau"}  # one "temperature" in cudal1: the policy's sampling one

    rounds: int = 3  # rounds after the reference round
    samples: int = 4  # candidates requested per task per round
    exemplars: int = 2  # measured exemplars shown per prompt
    strategy: str = "contrastive"  # exemplar selection: contrastive | random | best
    tau: float = 1.0  # softmax temperature over speedup buckets (log units; CUDA-L1's tau)
    feedback: bool = True  # show a failed candidate's error to the policy
    budget_minutes: float | None = None  # wall-clock budget for the whole run; None = no limit
    max_evaluations: int | None = None  # budget of judged candidates (reference included); None = no limit
    template: str = "contrastive_v1"  # prompt template (cudal1/prompts/templates)
    seed: int = 0  # seed of exemplar sampling
    profile: bool = False  # profile the reference once and each round's best; prompts show a measured section
    anchor: bool = True  # judge the reference itself (round 0, the 1.00x exemplar); off: it counts as 1.00x unjudged

    def validate(self) -> None:
        if self.rounds < 0 or self.samples < 1 or self.exemplars < 0:
            raise ConfigError("rounds >= 0, samples >= 1 and exemplars >= 0 are required")
        from cudal1.prompts.compose import available_templates
        from cudal1.prompts.select import STRATEGIES

        if self.strategy not in STRATEGIES:
            raise ConfigError(f"unknown exemplar strategy {self.strategy!r}; known: {', '.join(STRATEGIES)}")
        if self.template not in available_templates():  # before any judging, not at the first prompt
            raise ConfigError(f"unknown prompt template {self.template!r}; known: {', '.join(available_templates())}")
        if not self.tau > 0:
            raise ConfigError("tau must be > 0")
        if self.budget_minutes is not None and not self.budget_minutes > 0:
            raise ConfigError("budget_minutes must be positive")
        if self.max_evaluations is not None and self.max_evaluations < 1:
            raise ConfigError("max_evaluations must be at least 1")

    def identity(self) -> dict[str, object]:
        """The fields that shape what is searched (all but the stopping rules): a resumed run
        whose identity differs from the recorded one searches differently."""
        # profile off and anchor on are left out, so runs recorded before the fields existed keep their identity
        return {k: v for k, v in self.to_dict().items()
                if k not in STOPPING and (k != "profile" or v) and (k != "anchor" or not v)}
