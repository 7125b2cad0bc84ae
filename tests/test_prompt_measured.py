"""prompts.measured: the contrastive prompt's measured section, its budget and its trimming rule."""

from __future__ import annotations

import math

from cudal1.profile import BoundClass, KernelStat, ProfileStatus, ProgramProfile
from cudal1.prompts import build_prompt
from cudal1.prompts.measured import INTRO, NAME_CHARS, Shown, measured_section
from cudal1.types import Exemplar, Task

TASK = Task("t", "import torch\nclass Model(torch.nn.Module):\n    pass\n")


def _program(n: int, prefix: str, name_len: int = 10, call_us: float = 100.0) -> ProgramProfile:
    shares = [2.0 ** -(i + 1) for i in range(n)]
    kernels = [KernelStat((f"{prefix}{i}_" * name_len)[:name_len], 1, 10.0 * s, 10.0 * s, s)
               for i, s in enumerate(shares)]
    return ProgramProfile(status=ProfileStatus.OK, device="cuda", call_us=call_us, busy_us=call_us * 0.8,
                          kernels=kernels, bound=BoundClass.MEMORY, bandwidth_share=0.42)


def _rows(text: str, label: str) -> list[str]:
    block = text.split(f"### {label}")[1].split("###")[0]
    return [line for line in block.splitlines() if line.startswith("- ")]


class TestPrompt:
    def test_the_section_sits_after_the_exemplars_and_before_the_rules(self):
        ex = [Exemplar("class ModelNew: pass", 1.5, candidate_hash="a"),
              Exemplar("class ModelNew: 'x'", 2.5, candidate_hash="b")]
        profiles = {"reference": _program(7, "ref"), "b": _program(2, "fast"), "zzz": _program(1, "unshown")}
        user = build_prompt(TASK, ex, "NVIDIA H200", profiles=profiles).user
        assert user.index("Implementation 2: speedup 2.50x") < user.index("## Measured profiles") < \
            user.index("## Rules")
        assert "### Reference: 100 us call, device busy 80.0%, 7 launches, memory-bound, bandwidth 42.0% of peak" \
            in user
        assert len(_rows(user, "Reference")) == 5  # top 5 of 7
        assert "### Implementation 2 (2.50x)" in user and "Implementation 1 (" not in user and "unshown" not in user

    def test_without_profiles_the_prompt_is_unchanged(self):
        ex = [Exemplar("class ModelNew: pass", 1.5, candidate_hash="a")]
        plain = build_prompt(TASK, ex, "CPU")
        assert build_prompt(TASK, ex, "CPU", profiles={}) == plain
        failed_only = {"reference": ProgramProfile.not_ok(ProfileStatus.FAILED, "x")}
        assert build_prompt(TASK, ex, "CPU", profiles=failed_only) == plain
        assert "Measured" not in plain.user


class TestTrimming:
    def _shown(self) -> list[Shown]:
        return [Shown("Reference", _program(5, "r", 200), math.inf),
                Shown("Implementation 1 (1.10x)", _program(5, "s", 200), 1.0),
                Shown("Implementation 2 (3.00x)", _program(5, "b", 200), 1e9)]

    def test_in_budget_nothing_is_trimmed(self):
        text = measured_section(self._shown(), budget_chars=100_000)
        assert all(len(_rows(text, s.label)) == 5 for s in self._shown())
        assert max(len(line) for line in text.splitlines()) > 200  # full names

    def test_names_are_cut_first(self):
        full = measured_section(self._shown(), budget_chars=100_000)
        text = measured_section(self._shown(), budget_chars=len(full) - 1)
        rows = [r for s in self._shown() for r in _rows(text, s.label)]
        assert len(rows) == 15 and all(len(r.split(" x1 ")[1]) == NAME_CHARS for r in rows)

    def test_then_the_lowest_share_rows_of_the_longest_list_implementations_first(self):
        names_cut = measured_section(self._shown(), budget_chars=len(measured_section(self._shown(), 100_000)) - 1)
        row = len(_rows(names_cut, "Reference")[0]) + 1
        text = measured_section(self._shown(), budget_chars=len(names_cut) - 2 * row)
        counts = [len(_rows(text, s.label)) for s in self._shown()]
        assert counts == [5, 4, 4]  # one row each from the two implementations, the reference keeps its five
        assert _rows(text, "Implementation 1")[-1].startswith("- 6.2%")  # the 3% row went, the 6% one stayed

    def test_then_programs_slowest_first_and_at_last_nothing(self):
        one_row_each = len(measured_section([Shown(s.label, _program(1, "x", NAME_CHARS), s.rank)
                                             for s in self._shown()], budget_chars=100_000))
        text = measured_section(self._shown(), budget_chars=one_row_each - 1)
        assert "Implementation 1" not in text and "Reference" in text and "Implementation 2" in text
        assert all(len(_rows(text, label)) == 1 for label in ("Reference", "Implementation 2"))
        assert measured_section(self._shown(), budget_chars=len(INTRO) + 10) == ""
