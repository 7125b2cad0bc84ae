"""The contrastive prompt: exemplar selection, prompt rendering and response parsing.

* :func:`select_exemplars` / :func:`failed_feedback` (:mod:`.select`) choose what a prompt shows
  from a task's candidate pool (CUDA-L1's bucketed softmax sampling, plus ``random``/``best``);
  :func:`contrastive_prompt` builds the prompt from a pool, for the optimizer and GRPO alike.
* :func:`build_prompt` (:mod:`.build`) renders a versioned template (package data under
  ``templates/``) into a :class:`cudal1.types.Prompt`.
* :func:`parse_response` (:mod:`.parse`) splits an answer into analysis, design and ``ModelNew``
  code, or says why there is no usable code.
* :func:`check_analysis` (:mod:`.analysis`) checks the answer's Performance Analysis against the
  implementations its prompt showed (does it name the best one, cite speedups, give reasons).

Pure Python: nothing here imports torch or the judge (:mod:`cudal1.harness`).
"""

from cudal1.prompts.analysis import AnalysisCheck, check_analysis
from cudal1.prompts.compose import (
    DEFAULT_TEMPLATE,
    PromptTemplate,
    available_templates,
    build_prompt,
    exemplar_hash,
    format_speedup,
    load_template,
)
from cudal1.prompts.parse import parse_response, strip_reasoning
from cudal1.prompts.select import (
    DEFAULT_BUCKET_WIDTH,
    STRATEGIES,
    bucket_probabilities,
    contrastive_prompt,
    eligible,
    failed_feedback,
    select_exemplars,
    speedup_buckets,
)

__all__ = [
    "AnalysisCheck",
    "DEFAULT_BUCKET_WIDTH",
    "DEFAULT_TEMPLATE",
    "STRATEGIES",
    "PromptTemplate",
    "available_templates",
    "bucket_probabilities",
    "build_prompt",
    "check_analysis",
    "contrastive_prompt",
    "eligible",
    "exemplar_hash",
    "failed_feedback",
    "format_speedup",
    "load_template",
    "parse_response",
    "select_exemplars",
    "speedup_buckets",
    "strip_reasoning",
]
