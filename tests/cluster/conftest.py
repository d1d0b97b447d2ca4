import shutil

import pytest


# Files whose tests bound times or speed ratios (link delays, CPU quotas, round trips, a no-op setup's seconds, the
# cost of top's sampling, parallel SSH commands) or start host-wide daemons (test_slurm: munged, slurmctld): marked
# `timing`, scripts/test.sh runs them alone on the cores; the rest of the tier runs on two pytest processes, each
# with its own lab.
TIMING = {"test_lab_shaping.py", "test_link_advice.py", "test_lowcomm.py", "test_memory_cap.py", "test_doctor.py",
          "test_setup.py", "test_slurm.py", "test_ssh_nodes.py", "test_top.py"}


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.cluster)
            if item.fspath.basename in TIMING:
                item.add_marker(pytest.mark.timing)


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
