import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


def pytest_configure(config):
    config.addinivalue_line("markers", "real_model: integration tests on the embedded default model")
    config.addinivalue_line("markers", "browser: real-browser tests (Chromium + Playwright)")


@pytest.fixture(scope="session")
def real_lm():
    """The embedded default model, loaded once (converted and cached on first use)."""
    from racer import load_model
    return load_model("default", device="cpu", dtype="float32")
