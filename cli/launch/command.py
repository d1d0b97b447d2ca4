"""The bodies of `hrmctl train` and `hrmctl test-ddp` (cli/app.py parses the options into one LaunchOptions,
cli/launch/plan/options.py): the command's own reading of the overrides, then the stages in order, each given the
previous one's result: plan (LaunchOptions read, the overrides checked) -> preflight (prepare: a LaunchPlan) -> run and
supervise (job.run: a RunResult) -> report (supervise/report.py)."""

from __future__ import annotations

import dataclasses
import json
import signal
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from auralm.guides import spellings
from auralm.training.config import split_global_batch
from cli.errors import HrmctlError
from cli.launch.plan import guide_options, link_cache, planner
from cli.launch.plan.options import TRAINER, LaunchOptions
from cli.launch.plan.overrides import check_trainer_args, expand_config_files

if TYPE_CHECKING:
    from cli.launch.plan.plan import LaunchPlan
    from cli.launch.run.attempt import RunResult

# The later stages (preflight, run, supervise) are imported where they are called: a run sent to Slurm (_submit) needs
# none of them, and loading them cost its submission 0.1 s before sbatch (bench/slurm.py).

DDP_CHECK = "auralm.planning.ddp_check"
RESULT_TAG = "HRMCTL_RESULT "


def _reject_options(extra: list[str], what: str, own_options: list[str] = ()) -> None:
    for a in extra:
        if a.startswith("-"):
            hint = spellings.suggest(a.partition("=")[0], list(own_options), option=True)
            raise HrmctlError(f"unknown option {a}{hint or f'; {what}, and hrmctl options are listed by --help'}")


def _read_guide_options(opts: LaunchOptions, err: Console, own_options: list[str]) -> None:
    """A guide's options among the overrides (``--learning_rate 3e-4``, ``--dry_run``) as ours, said in one line."""
    read = guide_options.read(opts.args, "trainer overrides are key=value", own_options)
    opts.args = read.args
    for attr, value in read.options.items():
        setattr(opts, attr, value)
    if opts.distributed:
        read.said.append(guide_options.across_machines(opts))
    if read.said:
        err.print(f"hrmctl: read as ours: {'; '.join(read.said)}", markup=False, highlight=False, soft_wrap=True)


def _model_choice(opts: LaunchOptions) -> str:
    """How the overrides chose the model when model= did not name it ("hrm-27m (HRM), chosen from arch=hrm_v1"),
    by the trainer's own parser; a bad override is refused here, before anything starts."""
    if opts.trainer_refusal:
        raise HrmctlError(f"trainer overrides rejected: {opts.trainer_refusal}")
    return opts.trainer.model_choice if opts.trainer else ""


def auto_batch_plan(size: dict, prep: LaunchPlan) -> dict | None:
    """batch_size=auto before the run: per node, the largest micro-batch the model's estimate (auralm.planning.sizing)
    fits into the trainer's margin (``memory_margin``: auralm.planning.autobatch.MARGIN) of the memory the node's probe
    reported (a GPU's memory on a GPU node, else the RAM available, or its memory cgroup's if less) shared by
    its ranks; then the plan the trainer would make from the smallest. Each rank measures its own at start; this is the estimate. None unless batch_size=auto."""
    if not size or size.get("batch_size") != "auto":
        return None
    world = prep.world
    nodes, fits = {}, []
    for node_plan in prep.plans:
        facts = (prep.facts or {}).get(node_plan.node.name)
        gpu = bool(facts and facts.gpus)
        gb = (facts.gpu_memory_gb if gpu else facts.mem_available_gb) if facts else None
        ranks = 1 if gpu else node_plan.nproc  # a GPU each, or the node's RAM shared
        fit = None
        if gb:
            room = size["memory_margin"] * gb * 2**30 / ranks - size["states_bytes"]
            fit = max(0, int(room // max(1, size["activation_bytes_per_row"])))
            fits.append(fit)
        nodes[node_plan.node.name] = {"memory_gb": gb, "memory": "gpu" if gpu else "ram", "ranks": node_plan.nproc,
                                      "fits": fit}
    plan = {"nodes": nodes, "world": world}
    if fits and min(fits) > 0:
        total = size.get("global_batch_size") or 0
        batch, accum = split_global_batch(min(fits), world, total if total % world == 0 else 0,
                                          size.get("grad_accum") or 1)
        plan.update(batch_size=batch, grad_accum=accum, global_batch_size=batch * accum * world)
    return plan


def _sync_data(opts: LaunchOptions, console: Console) -> None:
    from cli.sync.run import sync_nodes

    remote = [n for n in opts.nodes if not n.is_local]
    if not remote:
        return
    console.print(f"[bold]hrmctl[/bold] syncing the dataset to {', '.join(n.name for n in remote)}", highlight=False)
    report = sync_nodes(remote, console=console, accept_new_host_keys=opts.accept_new_host_keys)
    report.raise_for_errors()


def _dry_run(opts: LaunchOptions, as_json: bool, console: Console, err: Console | None = None,
             advice: link_cache.Advice | None = None, choice: str = "") -> int:
    from cli.launch.supervise import report
    from cli.launch.plan.memory import model_size
    from cli.launch.preflight.prepare import prepare
    from cli.launch.plan.timing import start as run_time, summary as time_summary

    try:
        prep = prepare(opts)
        timing = run_time(opts, prep.world)  # the run's time, timed on this machine after the size estimate
        # the plan's estimate is for one rank (made beside the probes): for a world of one it is the run's own
        size = prep.size if prep.size and prep.world == 1 else model_size(opts, prep.world)
        link, time_doc = link_cache.warn(advice, err or console), time_summary(timing)
    finally:
        planner.close()
    return report.dry_run(prep, size, auto_batch_plan(size, prep), as_json=as_json, console=console, choice=choice,
                          link=link, timing=time_doc)


def plan_then_run(opts: LaunchOptions, console: Console, before_run=None) -> tuple[LaunchPlan, RunResult]:
    """The command's flow: the plan (preflight included), then the run on every node; the report is the caller's.
    The run may ask for the plan again, once, when a first launch's guessed facts were wrong on a node.
    ``before_run()`` is called between the two (train's warning about the link). What the nodes reported of their
    torch is cached for the next launch."""
    from cli.launch.preflight.node_facts import remember
    from cli.launch.preflight.prepare import prepare
    from cli.launch.supervise.job import run

    try:
        prep = prepare(opts, hold=True)
        if before_run:
            before_run()
    finally:
        planner.close()  # planned: the plan process's memory is the run's

    def replan(reported: dict[str, dict], nodes=None, args=None) -> LaunchPlan:
        """The plan again: from what nodes reported, and for other nodes or overrides (a node left or joined)."""
        changed = {k: v for k, v in (("nodes", nodes), ("args", args)) if v is not None}
        try:
            return prepare(dataclasses.replace(opts, run_id=prep.run_id, **changed), reported)
        finally:
            planner.close()

    result = run(prep, console, replan)
    remember(result.node_facts, opts.nodes)
    return prep, result


def train(opts: LaunchOptions, *, sync_data: bool, as_json: bool, console: Console, err: Console,
          own_options: list[str] = (), slurm=None) -> int:
    """``own_options``: hrmctl train's, for the "did you mean" of an unknown one. ``slurm`` (cli.slurm.submit's
    SlurmOptions): the run checked here, then submitted as a batch job whose own hrmctl launches it."""
    if opts.module == TRAINER:
        _read_guide_options(opts, err, list(own_options))
    else:
        _reject_options(opts.args, "trainer overrides are key=value", own_options)
    opts.check()
    opts.args = expand_config_files(opts.module, opts.args)
    choice = _model_choice(opts)
    if opts.trainer and opts.trainer.recipe_note:  # a paper's recipe (a pasted pretrain.py line implies one): said
        err.print(opts.trainer.recipe_note, markup=False, highlight=False, soft_wrap=True)
    if choice and not (opts.dry_run and not as_json):  # the dry run's text says it with the model's size
        err.print(f"model: {choice}", markup=False, highlight=False, soft_wrap=True)
    if slurm is not None:
        check_trainer_args(opts.module, opts.args)
        return _submit(opts, slurm, as_json, console)
    if opts.nodes[0].slurm_job:  # no --nodes, inside an allocation: a choice the user did not write, so said
        err.print(f"nodes: Slurm allocation {opts.nodes[0].slurm_job}: {', '.join(n.name for n in opts.nodes)} "
                  "(reached with srun)", markup=False, highlight=False, soft_wrap=True)
    advice = link_cache.start(opts)  # test-ddp's figures for these nodes, if any: sized beside the preflight
    link_cache.choose_wire(advice, opts, err)  # DiLoCo's wire and streaming, when the run leaves them: before the plan
    if opts.dry_run:
        return _dry_run(opts, as_json, console, err, advice, choice)
    opts.json_output = as_json
    if sync_data:
        _sync_data(opts, console)
    link: list[dict | None] = [None]

    def before_run() -> None:
        link[0] = link_cache.warn(advice, err)

    from cli.launch.supervise import report

    prep, result = plan_then_run(opts, console, before_run)
    code = report.finish(result, prep, as_json, console, err, extra={"link": link[0]})
    if result.interrupted and result.code == 128 + signal.SIGUSR1 and opts.nodes[0].slurm_job:
        from cli.slurm.allocation import requeue  # Slurm's warning before the time limit (hrmctl train --slurm)
        requeue(opts.nodes[0].slurm_job, err)
    return code


def _submit(opts: LaunchOptions, request, as_json: bool, console: Console) -> int:
    from cli.launch.preflight.prepare import new_run_id
    from cli.slurm.submit import submit, train_args

    run_id = opts.run_id or new_run_id()
    doc = submit(run_id, opts.runs_dir, request, train_args(opts), dry_run=opts.dry_run)
    if as_json:
        print(json.dumps(doc))
    elif opts.dry_run:
        console.print(doc["script"], markup=False, highlight=False, soft_wrap=True, end="")
    else:
        console.print(f"submitted run {run_id} as Slurm job {doc['job_id']}: `hrmctl logs {run_id} -f` follows it, "
                      f"`hrmctl stop {run_id}` cancels it", markup=False, highlight=False, soft_wrap=True)
    return 0


def test_ddp(opts: LaunchOptions, *, overrides: list[str] | None = None, as_json: bool, console: Console,
             err: Console, own_options: list[str] = ()) -> int:
    if overrides:  # the model to time: checked by the trainer's parser here, before anything starts
        _reject_options(overrides, "the model's overrides are key=value", own_options)
        check_trainer_args(TRAINER, overrides)
    opts.check()
    if opts.dry_run:
        return _dry_run(opts, as_json, console)
    results: list[dict] = []

    def on_result(node: str, payload: str) -> None:
        try:
            results.append(json.loads(payload))
        except ValueError:
            pass

    from cli.launch.supervise import report

    opts.result_tag, opts.on_result, opts.quiet, opts.json_output = RESULT_TAG, on_result, as_json, as_json
    prep, result = plan_then_run(opts, console)
    if results and not as_json:
        from cli.launch.supervise.ddp_report import show
        show(results[-1], console)
    found = results[-1] if results else None
    if found is not None and not found.get("ok") and result.code == 0:
        result.code, result.reason = 1, "a collective gave a wrong result"
    saved = link_cache.remember(found, opts.nodes) if result.code == 0 else None
    if saved and not as_json:
        console.print(f"[dim]saved for `hrmctl train --nodes {','.join(n.name for n in opts.nodes)}`: {escape(str(saved))}"
                      f"[/dim]", highlight=False, soft_wrap=True)
    return report.finish(result, prep, as_json, console, err, extra={"result": found, "link_cache": saved and str(saved)})


def ddp_check_args(*, min_size: str, max_size: str, seconds: float, soak: float, no_bandwidth: bool,
                   overrides: list[str] | None = None) -> list[str]:
    args = ["--no-table", "--min-size", min_size, "--max-size", max_size, "--seconds", str(seconds)]
    if soak:
        args += ["--soak", str(soak)]
    if no_bandwidth:
        args.append("--no-bandwidth")
    return args + list(overrides or [])

