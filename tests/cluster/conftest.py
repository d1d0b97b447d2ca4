import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def text_on_nodes(lab3, quijote_data) -> str:
    """The same prepared text (60k tokens, a 512-token vocabulary) in every lab node's data directory, owned by the
    node's user (what `hrmctl sync-data` leaves there); the path as a run names it."""
    lab3.give_data(quijote_data(512, 60000), "quijote")  # prepared once a session
    return "~/hrmctl/data/quijote"


@pytest.fixture(scope="session")
def book_on_nodes(lab3, quijote_data) -> str:
    """All of Don Quijote prepared (760k training tokens and 40k held out, a 1024-token vocabulary), as
    ``text_on_nodes`` gives it: enough that two nodes' 600 steps of 8 rows of 64 tokens do not go round it, and the
    held-out loss falls smoothly (tests/cluster/test_elastic_diloco.py compares two runs' final loss)."""
    lab3.give_data(quijote_data(1024, 10**6), "quijote-book")
    return "~/hrmctl/data/quijote-book"
