import pytest


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
