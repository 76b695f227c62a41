"""Shared fixtures: real models only (the embedded default and the built fixtures)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from pocket_agent.runtime import Model, default_model_path, load_model, set_default_model

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
SAMPLE_DATA = ROOT / "tests" / "data"
FIXTURES = ROOT / "tests" / "fixtures"
TINY_GGUF = FIXTURES / "tiny-qwen3" / "tiny-qwen3-f16.gguf"
TINY_MNN = FIXTURES / "tiny-qwen3" / "mnn" / "config.json"
# One thread: on a shared 2-core machine llama.cpp's spinning thread barrier makes 2
# threads up to 100x slower when the other core is busy.
THREADS = int(os.environ.get("POCKET_AGENT_TEST_THREADS", "1"))


def full_data() -> bool:
    """Whether the full development sets (``../shared/data``) are beside the repository."""
    return SHARED_DATA.is_dir()


def schema_order_key(name: str, seed: int = 1234) -> str:
    """The seeded order JSONSchemaBench schemas are drawn in, independent of which other files are present,
    so the plain-clone sample holds the same first schemas as the full set."""
    return hashlib.sha256(f"{seed}:{name}".encode()).hexdigest()


def dev_data(name: str) -> Path:
    """The development set ``name``: the full set in ``../shared/data`` where it is (developers, CI),
    else its small sample in ``tests/data`` (a user's plain clone; see ``scripts/make_test_data.py``).
    Under CI the full set must be there, so CI keeps running the full-data suites."""
    if full_data():
        return SHARED_DATA / name
    if os.environ.get("CI"):
        pytest.fail(f"CI runs the full-data suites: {SHARED_DATA / name} is missing")
    return SAMPLE_DATA / name


@pytest.fixture(scope="session")
def default_gguf() -> Path:
    return default_model_path()


@pytest.fixture(scope="session")
def smollm(default_gguf: Path) -> Iterator[Model]:
    """SmolLM2-135M-Instruct on llama.cpp, shared by the whole session and set as default."""
    model = load_model(default_gguf, threads=THREADS)
    set_default_model(model)
    yield model
    set_default_model(None)
    model.close()


@pytest.fixture
def fresh_smollm(smollm: Model) -> Model:
    """The shared model with an empty KV cache and zeroed counters."""
    smollm.reset()
    smollm.stats.tokens_evaluated = 0
    smollm.stats.eval_calls = 0
    return smollm


@pytest.fixture(scope="session")
def tiny_gguf() -> Iterator[Model]:
    if not TINY_GGUF.is_file():
        pytest.fail(f"fixture model missing: {TINY_GGUF}; run scripts/build_fixtures.py")
    model = load_model(TINY_GGUF, threads=THREADS)
    yield model
    model.close()


def chat_ids(model: Model, question: str, system: str = "You are a helpful assistant.") -> list[int]:
    text = model.chat_template.render(
        [{"role": "system", "content": system}, {"role": "user", "content": question}], add_generation_prompt=True
    )
    return model.tokenize(text, special=True)
