"""Response parsing: an LLM answer → :class:`ParsedResponse` (analysis, design, code or a problem).

Contract: :func:`parse_response` never raises on a string; a response without usable code comes
back with ``code=None`` and a one-line ``problem`` (a format failure to record, not to drop).

Steps:

1. Reasoning blocks are removed first: ``<think>…</think>`` (and ``<thinking>``), everything up to
   a stray closing tag (chat templates that open the block in the prompt), and everything after an
   unclosed opening tag (a response cut off while reasoning).  Code drafted while reasoning is
   never taken.
2. The text is split into lines and fenced code blocks (```` ``` ```` or ``~~~``, any length,
   indented or not, an unclosed last fence running to the end).  Headings are looked for only
   outside code blocks.  A heading names one of the three sections, case-insensitively, in any of
   these styles: ``## Performance Analysis``, ``**Performance Analysis:** text``,
   ``1. Performance Analysis``, ``### 1) Algorithm design``, ``Code Implementation:`` alone on a
   line.  A plain sentence that merely starts with the words is not a heading.
3. ``analysis``/``design`` are the text under the first heading of each (``""`` when absent).
4. Code: only blocks labelled Python (``python``, ``py``, ``python3``) or unlabelled count.  The
   chosen block is the last one under a Code Implementation heading that defines ``ModelNew``
   (a class, or a module-level assignment); only when that section has none, the last block
   anywhere that does.  Within that choice, blocks that parse (``ast.parse``) are preferred; if
   none parses the answer is a format failure (a broken final answer is never replaced by code
   quoted elsewhere).  With no fenced block at
   all, a response that is itself Python defining ``ModelNew`` is accepted.

Not covered: whether the code is *correct* or honest (the judge decides), and prose outside the
three sections (ignored).
"""

from __future__ import annotations

import ast
import logging
import re
import textwrap
from dataclasses import dataclass

from cudal1.types import ParsedResponse

log = logging.getLogger(__name__)

SECTIONS = ("analysis", "design", "code")
_SECTION_NAMES = {
    "performance analysis": "analysis",
    "algorithm design": "design",
    "code implementation": "code",
}
PYTHON_LANGS = frozenset({"", "python", "py", "python3", "py3"})

# Problems (prefixes are stable; details may follow after ": ").
NO_CODE_BLOCK = "no code block"
NO_PYTHON_BLOCK = "no python code block"
NO_MODELNEW = "no class ModelNew in any code block"
DOES_NOT_PARSE = "code block does not parse"
EMPTY_RESPONSE = "empty response"

_THINK_PAIR = re.compile(r"<(think|thinking)>.*?</\1\s*>", re.IGNORECASE | re.DOTALL)
_THINK_CLOSE = re.compile(r"</(think|thinking)\s*>", re.IGNORECASE)
_THINK_OPEN = re.compile(r"<(think|thinking)>", re.IGNORECASE)
_FENCE_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\n]*)$")
_HEADING = re.compile(
    r"""^[ \t]*
    (?:[-+•][ \t]+)?
    (?P<hashes>\#{1,6}[ \t]*)?
    (?P<num1>(?:step[ \t]*)?\(?\d{1,2}[.):][ \t]*)?
    (?P<emph>[*_]{1,3})?[ \t]*
    (?P<num2>\(?\d{1,2}[.):][ \t]*)?
    (?P<name>performance[ \t]+analysis|algorithm[ \t]+design|code[ \t]+implementation)\b
    (?P<tail>.*)$""",
    re.IGNORECASE | re.VERBOSE,
)
_DECORATION = " \t*_:.-–—"


@dataclass
class _Block:
    lang: str
    code: str
    section: str | None  # section heading it sits under (None before any heading)


@dataclass
class _Heading:
    section: str
    inline: str  # text on the heading line after the heading itself


def strip_reasoning(text: str) -> tuple[str, bool]:
    """``text`` without reasoning blocks, and whether it ended inside an unclosed one."""
    text = _THINK_PAIR.sub("", text)
    closes = list(_THINK_CLOSE.finditer(text))
    if closes:  # a closing tag whose opening tag was in the prompt: drop everything before it
        text = text[closes[-1].end():]
    opened = _THINK_OPEN.search(text)
    if opened:  # cut off while reasoning
        return text[: opened.start()], True
    return text, False


def _heading(line: str) -> _Heading | None:
    m = _HEADING.match(line)
    if not m:
        return None
    tail = m.group("tail")
    has_marker = bool(m.group("hashes") or m.group("emph"))
    numbered = bool(m.group("num1") or m.group("num2"))
    rest = tail.strip(_DECORATION)
    if not has_marker:
        # "1. Performance Analysis: ..." or a bare "Performance Analysis:" line is a heading;
        # "Performance analysis shows that ..." is prose.
        stripped = tail.lstrip(" \t*_")
        if rest and not (numbered and stripped[:1] in (":", "-", "–", "—")):
            return None
    section = _SECTION_NAMES[" ".join(m.group("name").lower().split())]
    if m.group("hashes"):
        return _Heading(section, "")  # a Markdown heading line is all title
    # "**Performance Analysis:** the fast one ..." keeps the text after the title
    inline = tail.lstrip(_DECORATION).rstrip()
    emph = m.group("emph") or ""
    if emph and inline.endswith(emph) and emph not in inline[: -len(emph)]:
        inline = inline[: -len(emph)].rstrip()  # "**Code Implementation (final)**"
    return _Heading(section, inline)


def _scan(text: str) -> tuple[dict[str, list[str]], list[_Block]]:
    """Section texts (first heading of each name) and code blocks, in order of appearance."""
    lines = text.splitlines()
    sections: dict[str, list[str]] = {}
    blocks: list[_Block] = []
    current: str | None = None
    collecting: list[str] | None = None  # text lines of the current section (first occurrence only)
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE_OPEN.match(line)
        if fence:
            close = re.compile(
                r"^[ \t]*" + re.escape(fence.group("fence")[0]) + "{" + str(len(fence.group("fence"))) + r",}[ \t]*$"
            )
            j = i + 1
            while j < len(lines) and not close.match(lines[j]):
                j += 1
            body = textwrap.dedent("\n".join(lines[i + 1 : j]))
            info = fence.group("info").strip().split()
            lang = info[0].lower().lstrip("{.").rstrip("}") if info else ""
            blocks.append(_Block(lang=lang, code=body, section=current))
            if collecting is not None:
                collecting.extend(lines[i : j + 1])
            i = j + 1
            continue
        heading = _heading(line)
        if heading is not None:
            current = heading.section
            if current in sections:
                collecting = None  # a repeated heading: keep the first section's text
            else:
                collecting = sections[current] = [heading.inline] if heading.inline else []
        elif collecting is not None:
            collecting.append(line)
        i += 1
    return sections, blocks


def _defines_modelnew(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "ModelNew":
            return True
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
            isinstance(t, ast.Name) and t.id == "ModelNew" for t in targets
        ):
            return True
    return False


_MODELNEW_TEXT = re.compile(r"^[ \t]*(class[ \t]+ModelNew\b|ModelNew[ \t]*(:[^=\n]*)?=)", re.MULTILINE)


def _assess(code: str) -> tuple[bool, bool, str]:
    """(mentions ModelNew, parses, syntax error message) for one block."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError) as exc:  # ValueError: null bytes
        where = f"line {exc.lineno}: " if getattr(exc, "lineno", None) else ""
        msg = getattr(exc, "msg", None) or str(exc)
        return bool(_MODELNEW_TEXT.search(code)), False, f"{where}{msg}"
    return _defines_modelnew(tree), True, ""


def _choose(blocks: list[_Block]) -> tuple[str | None, str]:
    python = [b for b in blocks if b.lang in PYTHON_LANGS]
    if not python:
        langs = sorted({b.lang for b in blocks})
        return None, f"{NO_PYTHON_BLOCK} (blocks labelled: {', '.join(langs)})"
    assessed = [(b, *_assess(b.code)) for b in python]
    defining = [a for a in assessed if a[1]]
    if not defining:
        return None, NO_MODELNEW
    # The Code Implementation section wins when it has a ModelNew block at all: a broken answer
    # there must not be replaced by code quoted elsewhere (e.g. an exemplar in the analysis).
    pool = [a for a in defining if a[0].section == "code"] or defining
    parsing = [a for a in pool if a[2]]
    if parsing:
        return parsing[-1][0].code.strip("\n") + "\n", ""
    return None, f"{DOES_NOT_PARSE}: {pool[-1][3]}"


def _bare_code(text: str, sections: dict[str, list[str]]) -> str | None:
    """A response with no fences that is itself Python defining ``ModelNew`` (or whose Code
    Implementation section is)."""
    candidates = ["\n".join(sections["code"])] if "code" in sections else []
    candidates.append(text)
    for code in candidates:
        code = textwrap.dedent(code).strip("\n")
        defines, parses, _ = _assess(code)
        if code and defines and parses:
            return code + "\n"
    return None


def _parse(text: str) -> ParsedResponse:
    text, truncated = strip_reasoning(text.replace("\r\n", "\n").replace("\r", "\n"))
    sections, blocks = _scan(text)
    analysis = "\n".join(sections.get("analysis", [])).strip()
    design = "\n".join(sections.get("design", [])).strip()
    if not text.strip():
        problem = EMPTY_RESPONSE + (" (the response ended inside a <think> block)" if truncated else "")
        return ParsedResponse(analysis, design, None, problem)
    if not blocks:
        code = _bare_code(text, sections)
        if code is not None:
            return ParsedResponse(analysis, design, code, "")
        problem = NO_CODE_BLOCK + (" (the response ended inside a <think> block)" if truncated else "")
        return ParsedResponse(analysis, design, None, problem)
    code, problem = _choose(blocks)
    return ParsedResponse(analysis, design, code, problem)


def parse_response(text: str) -> ParsedResponse:
    """Split an LLM response into CUDA-L1's sections and pick its ``ModelNew`` code (see module
    docstring).  Never raises: non-strings are treated as their ``str()`` (``None`` as empty), and
    an internal error becomes a format failure whose ``problem`` says so."""
    if text is None:
        text = ""
    elif not isinstance(text, str):
        text = str(text)
    try:
        return _parse(text)
    except Exception as exc:  # logged, never raised: a parser bug must not kill the search loop
        log.warning("parse_response failed on a %d-character response", len(text), exc_info=True)
        return ParsedResponse("", "", None, f"parser error: {type(exc).__name__}: {exc}")
