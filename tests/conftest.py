import os
import sys

import pytest

# The helpers and op table are plain modules next to the tests.
sys.path.insert(0, os.path.dirname(__file__))


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite tests/golden/* from the current output (review the diff)")


@pytest.fixture(autouse=True, scope="session")
def _private_c_cache(tmp_path_factory):
    """Libraries the C backend builds go to a session temporary directory, not to
    ~/.cache, unless CA_CACHE_DIR already names one."""
    if os.environ.get("CA_CACHE_DIR"):
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CA_CACHE_DIR", str(tmp_path_factory.mktemp("ca_cache")))
        yield


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh, empty C build cache for this test. (The project's own extension,
    the C backend's call, is loaded first, from the usual cache: this one holds
    only what the test builds.)"""
    from compiled_autograd.codegen.c_run import C_CALL
    C_CALL.module()
    path = tmp_path / "cache"
    monkeypatch.setenv("CA_CACHE_DIR", str(path))
    monkeypatch.delenv("CA_C_FALLBACK", raising=False)
    monkeypatch.delenv("CA_C_EXTRA_FLAGS", raising=False)
    return path


@pytest.fixture
def fresh_compiled_cache():
    """An empty compiled-autograd cache and zeroed stats, before and after."""
    import compiled_autograd as ca
    ca.reset_compiled_autograd()
    yield
    ca.reset_compiled_autograd()
