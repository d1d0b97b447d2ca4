import pytest


def pytest_collection_modifyitems(items):
    """The trainer tier is real trainings in several processes (torchrun, spawned gloo ranks): all of it is
    ``slow``, so `scripts/test.sh --fast` (``-m "not cluster and not slow"``) leaves it out."""
    for item in items:
        if "tests/trainer/" in str(item.fspath):
            item.add_marker(pytest.mark.slow)
