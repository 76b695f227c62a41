"""One-pass decisions: pick one of several options for a question.

``decide(question, options, context=...)`` scores every option in one forward pass with
one of three methods: ``cloze`` (log-probability of each option's text, all options in
one batched evaluation), ``letter`` (logits of the option labels) or ``pointer`` (a
trained Dec adapter: a small head reads the hidden state that closes each option).
``train_head`` fits a pointer head on labelled questions with numpy; Dec adapters are
saved and loaded as described in ``FORMAT.md``.
"""

from ..runtime.identity import model_identity
from ._features import FeatureSpec
from ._layout import DEFAULT_FORMAT, PromptFormat
from .adapter import (
    DecisionAdapter,
    get_decision_adapter,
    load_decision_adapter,
    unload_decision_adapter,
)
from .core import Decision, decide, decide_many, find_shipped_head, forget_default_head, shipped_heads
from .train import DEFAULT_FEATURES, HeadTraining, TrainResult, extract_features, load_examples, train_head

__all__ = [
    "DEFAULT_FEATURES",
    "DEFAULT_FORMAT",
    "Decision",
    "DecisionAdapter",
    "FeatureSpec",
    "HeadTraining",
    "PromptFormat",
    "TrainResult",
    "decide",
    "decide_many",
    "extract_features",
    "find_shipped_head",
    "forget_default_head",
    "get_decision_adapter",
    "load_decision_adapter",
    "load_examples",
    "model_identity",
    "shipped_heads",
    "train_head",
    "unload_decision_adapter",
]
