"""Shared fixtures: real models only (the embedded default and the built fixtures), and the
fast tier: every test that loads, converts or serves a real model is marked ``slow``, so
``pytest -m "not slow"`` runs the rest in about a minute while ``pytest`` still runs all."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


# Fixtures that load a real model, quantise or convert one, or start what does (a server or an
# MNN worker in a subprocess, a Ray cluster). A test using any of them, directly or through
# another fixture, is marked slow by ``pytest_collection_modifyitems`` below; a test that loads
# a model in its own body carries ``@pytest.mark.slow`` itself.
MODEL_FIXTURES = frozenset(
    {
        # tests/conftest.py
        "smollm",
        "tiny_gguf",
        # tests/test_batched.py, test_decision.py, test_distributed.py
        "smollm_copy",
        "model",
        "local_ray",
        # tests/test_layout.py, test_merged.py, test_split_weights.py (tiny_q4_1 quantises)
        "tiny_q4_1",
        "split",
        # tests/test_runtime_mnn.py (MNN workers in subprocesses)
        "smollm2_mnn",
        "tiny_mnn",
        # tests/test_runtime_transformers.py
        "tiny_tf",
        "smol_tf",
        "smollm_q4_1",
        # tests/test_server.py (the server subprocess loads the default model)
        "server",
        "keyed_server",
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark slow every test whose fixtures (their whole closure) load a real model."""
    for item in items:
        if MODEL_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _real_models_only_in_slow_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keeps the fast tier fast: a test not marked slow that loads a real model in this process
    (or quantises one) fails and names itself. Loads that fail (the typed-error tests) pass through."""
    if request.node.get_closest_marker("slow") is not None:
        return
    from pocket_agent.runtime import hf, llamacpp, mnn

    def refuse(owner: object, name: str) -> None:
        original = getattr(owner, name)

        def guarded(*args: Any, **kwargs: Any) -> None:
            original(*args, **kwargs)
            if name == "__init__":
                args[0].close()
            pytest.fail(
                f"{request.node.nodeid} loads a real model ({getattr(owner, '__name__', owner)}.{name}) but is not "
                "marked slow: use a model fixture (tests/conftest.py MODEL_FIXTURES) or @pytest.mark.slow",
                pytrace=False,
            )

        monkeypatch.setattr(owner, name, guarded)

    for cls in (llamacpp.LlamaCppModel, mnn.MnnModel, hf.TransformersModel):
        refuse(cls, "__init__")
    refuse(llamacpp, "quantize_gguf")


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
