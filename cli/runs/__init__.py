"""`hrmctl runs`, `hrmctl logs`, `hrmctl plot`: find and compare the runs under runs/ (see docs/runs.md).

states   RunState: a run's state, one enum (status.json's state, the catalog's status)
catalog  a run directory read: status (status.json from cli/launch, else inferred), start, duration, nodes, task,
         model, steps, best validation loss / exact accuracy; RUN resolved as an id, a unique prefix or a path
view     `hrmctl runs`: the catalog as a table, or --json
logs     `hrmctl logs`: the node logs merged by the launcher's time stamps, or one node's; --follow
control  `hrmctl attach` (logs --follow, then the run's end and exit code) and `hrmctl stop` (SIGTERM to the run's
         launcher, by status.json's pid and start time; then waits for its record of the end)
plot     `hrmctl plot`: one metric of several runs, a PNG (matplotlib) or the terminal (plotext)

Flow: app -> view / logs / plot / control -> catalog. Reads files only (stop signals a local process): no network, no
torch.
May import: cli.errors, and auralm.training.curves — the trainer's pure module that reads metrics.jsonl and draws curves
(standard library + matplotlib, no torch), so that `hrmctl plot` and each run's curves.png are the same drawing.
It is the one module of auralm the cli imports; auralm never imports cli.
"""
