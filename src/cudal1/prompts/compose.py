"""Contrastive prompt construction: a task, measured exemplars and the hardware → one :class:`Prompt`.

Contract: :func:`build_prompt` is a pure function of its arguments and the template file; the
same inputs give byte-identical messages, and the returned :class:`Prompt` records the template
version and the hashes of the exemplars it shows (in the order shown), so a stored prompt can be
traced back to the pool it came from.

What a prompt shows:

* the task's reference source and the hardware string, verbatim;
* the successful exemplars (``status == "ok"``), **sorted by speedup ascending** so the best one is
  last — nearest the instructions and the model's answer, and reading as a progression from slow
  to fast.  An ``ok`` exemplar without a measured speedup sorts first and reads "not measured";
* with ``feedback=True``, the failed exemplars (any other status) in a separate section, each with
  its status and its ``feedback`` text truncated to ``max_feedback_chars`` (head and tail kept:
  the first compiler error and the final exception line are usually what matter).  With
  ``feedback=False`` failed exemplars are left out entirely (their code without the reason it
  failed teaches nothing) and their hashes are not recorded;
* the rules and the required response sections.  With no exemplars to show, the contrastive
  section is omitted and the analysis instruction asks about the reference instead.

* with ``profiles`` (candidate hash, or ``"reference"``, to a measured profile), a measured
  section after the exemplars (:mod:`cudal1.prompts.measured`: top kernels, class, bandwidth
  share), within its own character budget and trimmed by the rule written there; without it the
  prompt is byte-identical to one built before profiles existed.

Not covered: choosing *which* exemplars to show (see :mod:`cudal1.prompts.select`), token budgets
for the rest of the prompt (long exemplars are shown in full; the caller chooses how many), and
chat-template rendering.
"""

from __future__ import annotations

import functools
import math
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING

from cudal1.prompts.measured import BUDGET_CHARS, Shown, measured_section
from cudal1.types import Exemplar, Prompt, Task, content_hash

if TYPE_CHECKING:
    from cudal1.profile.model import ProgramProfile

DEFAULT_TEMPLATE = "contrastive_v1"

# Parts every template must define; anything else in the file is an error (a typo'd part name
# would otherwise silently never be used).
REQUIRED_PARTS = (
    "system",
    "user",
    "exemplar_section",
    "exemplar",
    "failure_section",
    "failure",
    "analysis_with_exemplars",
    "analysis_without_exemplars",
)

_PART_MARKER = re.compile(r"^<!-- part: ([a-z_]+) -->[ \t]*$", re.MULTILINE)
_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class PromptTemplate:
    """A loaded template: its version name and its parts as :class:`string.Template` objects."""

    name: str
    parts: dict[str, string.Template]

    def render(self, part: str, **values: str) -> str:
        """Substitute ``values`` into ``part``; a missing placeholder raises ``KeyError``."""
        return self.parts[part].substitute(values).strip("\n")


def _templates_dir():
    return resources.files("cudal1.prompts") / "templates"


def available_templates() -> list[str]:
    """Names of the templates shipped as package data (file stems of ``templates/*.md``)."""
    return sorted(
        entry.name[: -len(".md")] for entry in _templates_dir().iterdir() if entry.name.endswith(".md")
    )


@functools.lru_cache(maxsize=None)
def load_template(name: str = DEFAULT_TEMPLATE) -> PromptTemplate:
    """Load template ``name`` (e.g. ``"contrastive_v1"``) from package data.

    Raises ``KeyError`` naming the known templates if there is no such file, and ``ValueError``
    if the file lacks a required part or defines an unknown one.  Loaded templates are cached
    (package data does not change while a process runs).
    """
    known = available_templates()
    if not isinstance(name, str) or not _NAME_OK.match(name) or name not in known:
        raise KeyError(f"unknown prompt template {name!r}; known templates: {', '.join(known)}")
    text = (_templates_dir() / f"{name}.md").read_text(encoding="utf-8")
    pieces = _PART_MARKER.split(text)  # [preamble, name1, body1, name2, body2, ...]
    parts: dict[str, string.Template] = {}
    for part_name, body in zip(pieces[1::2], pieces[2::2]):
        if part_name in parts:
            raise ValueError(f"template {name!r}: part {part_name!r} is defined twice")
        parts[part_name] = string.Template(body)
    missing = [p for p in REQUIRED_PARTS if p not in parts]
    unknown = [p for p in parts if p not in REQUIRED_PARTS]
    if missing or unknown:
        raise ValueError(f"template {name!r}: missing parts {missing}, unknown parts {unknown}")
    return PromptTemplate(name=name, parts=parts)


def format_speedup(speedup: float | None) -> str:
    """``1.7312`` → ``"1.73x"``; extreme values keep three significant digits; None → "not measured"."""
    if speedup is None or not math.isfinite(speedup):
        return "not measured"
    if 0.01 <= speedup < 100:
        return f"{speedup:.2f}x"
    return f"{speedup:.3g}x"


def fenced(text: str, lang: str = "python") -> str:
    """``text`` in a Markdown code fence longer than any backtick run inside it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{text.strip(chr(10))}\n{fence}"


def truncate_middle(text: str, max_chars: int) -> str:
    """``text`` cut to about ``max_chars`` characters, keeping the first two thirds and the last
    third of the budget with a marker saying how much was dropped in between."""
    text = text.strip()
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    head = (2 * max_chars) // 3
    tail = max_chars - head
    omitted = len(text) - head - tail
    return f"{text[:head]}\n... [{omitted} characters omitted] ...\n{text[-tail:] if tail else ''}".rstrip()


def exemplar_hash(exemplar: Exemplar) -> str:
    """The exemplar's ``candidate_hash``, or the :class:`Candidate` hash of its code when unset."""
    return exemplar.candidate_hash or content_hash("candidate", exemplar.code)


def _sort_key(exemplar: Exemplar) -> float:
    s = exemplar.speedup
    return s if s is not None and math.isfinite(s) else -math.inf


def build_prompt(
    task: Task,
    exemplars: list[Exemplar],
    hardware: str,
    *,
    feedback: bool = True,
    template: str = DEFAULT_TEMPLATE,
    max_feedback_chars: int = 1500,
    profiles: Mapping[str, ProgramProfile] | None = None,
    profile_budget_chars: int = BUDGET_CHARS,
) -> Prompt:
    """Render the contrastive prompt for ``task`` showing ``exemplars`` (see the module docstring).

    ``hardware`` names where the code runs (a GPU name such as ``"NVIDIA H100 80GB HBM3"``, or
    ``"CPU"``); an empty string is a ``ValueError``.  ``Prompt.exemplar_hashes`` lists the shown
    exemplars, successful ones first (slowest to fastest), then failed ones.
    """
    if not hardware or not hardware.strip():
        raise ValueError("hardware must name the device the code runs on (a GPU name or 'CPU')")
    tpl = load_template(template)
    ok = sorted((e for e in exemplars if e.status == "ok"), key=_sort_key)  # stable: ties keep order
    failed = [e for e in exemplars if e.status != "ok"] if feedback else []

    exemplar_section = ""
    if ok:
        blocks = [
            tpl.render("exemplar", index=str(i), speedup=format_speedup(e.speedup), code_block=fenced(e.code))
            for i, e in enumerate(ok, 1)
        ]
        exemplar_section = tpl.render("exemplar_section", count=str(len(ok)), exemplars="\n\n".join(blocks))
        exemplar_section += "\n\n"
    failure_section = ""
    if failed:
        blocks = [
            tpl.render(
                "failure",
                index=str(i),
                status=e.status,
                feedback_block=fenced(
                    truncate_middle(e.feedback, max_feedback_chars) or "(no details recorded)", "text"
                ),
                code_block=fenced(e.code),
            )
            for i, e in enumerate(failed, 1)
        ]
        failure_section = tpl.render("failure_section", count=str(len(failed)), failures="\n\n".join(blocks))
        failure_section += "\n\n"

    if profiles:
        measured = measured_section(_shown(ok, profiles), profile_budget_chars)
        exemplar_section += measured + "\n\n" if measured else ""
    analysis = tpl.render("analysis_with_exemplars" if ok or failed else "analysis_without_exemplars")
    user = tpl.render(
        "user",
        task_name=task.name,
        reference_block=fenced(task.source),
        hardware=hardware.strip(),
        exemplar_section=exemplar_section,
        failure_section=failure_section,
        analysis_instruction=analysis,
    )
    return Prompt(
        task_name=task.name,
        task_hash=task.hash,
        system=tpl.render("system"),
        user=user + "\n",
        template_version=tpl.name,
        exemplar_hashes=tuple(exemplar_hash(e) for e in ok + failed),
    )


def _shown(ok: list[Exemplar], profiles: Mapping[str, ProgramProfile]) -> list[Shown]:
    """The profiled programs in prompt order, ranked for trimming: the reference and the best
    implementation (shown last) stay longest, then faster before slower."""
    shown = [Shown("Reference", profiles["reference"], math.inf)] if "reference" in profiles else []
    for i, e in enumerate(ok, 1):
        p = profiles.get(exemplar_hash(e))
        if p is not None:
            rank = 1e9 if i == len(ok) else float(i)
            shown.append(Shown(f"Implementation {i} ({format_speedup(e.speedup)})", p, rank))
    return shown
