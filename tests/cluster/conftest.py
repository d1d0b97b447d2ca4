import shutil

import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def text_on_nodes(lab3, quijote_data) -> str:
    """The same prepared text in every lab node's data directory, owned by the node's user (what `hrmctl
    sync-data` leaves there); the path as a run names it."""
    local = quijote_data(512, 60000)  # prepared once a session
    for node in lab3.nodes:
        parent = node.home / "hrmctl" / "data"
        parent.mkdir(parents=True, exist_ok=True)
        target = parent / "quijote"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(local, target)
        for p in [parent.parent, parent, target, *target.rglob("*")]:
            shutil.chown(p, node.user, node.user)
    return "~/hrmctl/data/quijote"
