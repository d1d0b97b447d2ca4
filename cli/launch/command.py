"""The bodies of `hrmctl train` and `hrmctl test-ddp` (cli/app.py only parses options)."""

from __future__ import annotations

import dataclasses
import json

from rich.console import Console
from rich.markup import escape

from auralm import guide_spellings
from auralm.config import split_global_batch
from cli.errors import HrmctlError
from cli.nodes.inventory import Node, load_inventory, local_node
from cli.launch import guide_options, links
from cli.launch.memory import model_size
from cli.launch.plan import TRAINER
from cli.launch.prepare import (LaunchOptions, Prepared, check_trainer_args, dry_run_json, dry_run_text,
                               expand_config_files, prepare)
from cli.launch.run import RunResult, run, summary_line
from cli.launch.plan import parse_env_options

DDP_CHECK = "auralm.ddp_check"
RESULT_TAG = "HRMCTL_RESULT "


def select_nodes(inventory: str | None, nodes: str | None) -> list[Node]:
    """--nodes from the inventory; without --nodes, this machine alone (the embedded default)."""
    if nodes is None:
        return [local_node()]
    return load_inventory(inventory).select(nodes)


def _reject_options(extra: list[str], what: str, own_options: list[str] = ()) -> None:
    for a in extra:
        if a.startswith("-"):
            hint = guide_spellings.suggest(a.partition("=")[0], list(own_options), option=True)
            raise HrmctlError(f"unknown option {a}{hint or f'; {what}, and hrmctl options are listed by --help'}")


def _read_guide_options(opts: LaunchOptions, err: Console, own_options: list[str]) -> None:
    """A guide's options among the overrides (``--learning_rate 3e-4``, ``--dry_run``) as ours, said in one line."""
    read = guide_options.read(opts.args, "trainer overrides are key=value", own_options)
    opts.args = read.args
    for attr, value in read.options.items():
        setattr(opts, attr, value)
    if read.said:
        err.print(f"hrmctl: read as ours: {'; '.join(read.said)}", markup=False, highlight=False, soft_wrap=True)


def _model_choice(opts: LaunchOptions) -> str:
    """How the overrides chose the model when model= did not name it ("hrm-27m (HRM), chosen from arch=hrm_v1"),
    by the trainer's own parser; a bad override is refused here, before anything starts."""
    if opts.module != TRAINER:
        return ""
    from auralm import config
    from auralm.errors import UserError

    try:
        return config.parse(opts.args).model_choice
    except UserError as e:
        raise HrmctlError(f"trainer overrides rejected: {e}") from None


def options(*, inventory, nodes, master_port, nproc, backend, env, max_restarts, dry_run, run_id,
            accept_new_host_keys, reprobe, module, args) -> LaunchOptions:
    if backend not in ("auto", "gloo", "nccl"):
        raise HrmctlError(f"--backend {backend}: choose auto, gloo or nccl")
    return LaunchOptions(nodes=select_nodes(inventory, nodes), module=module, args=list(args),
                         master_port=master_port, nproc=nproc, backend=backend, env=parse_env_options(env or []),
                         max_restarts=max_restarts, dry_run=dry_run, run_id=run_id,
                         accept_new_host_keys=accept_new_host_keys, use_cache=not reprobe)


def auto_batch_plan(size: dict, prep: Prepared) -> dict | None:
    """batch_size=auto before the run: per node, the largest micro-batch the model's estimate (auralm.sizing)
    fits into the trainer's margin (``memory_margin``: auralm.autobatch.MARGIN) of the memory the node's probe
    reported (a GPU's memory on a GPU node, else the RAM available, or its memory cgroup's if less) shared by
    its ranks; then the plan the trainer would make from the smallest. Each rank measures its own at start; this is the estimate. None unless batch_size=auto."""
    if not size or size.get("batch_size") != "auto":
        return None
    world = sum(p.nproc for p in prep.plans)
    nodes, fits = {}, []
    for p in prep.plans:
        f = (prep.facts or {}).get(p.node.name)
        gpu = bool(f and f.gpus)
        gb = (f.gpu_memory_gb if gpu else f.mem_available_gb) if f else None
        ranks = 1 if gpu else p.nproc  # a GPU each, or the node's RAM shared
        fit = None
        if gb:
            room = size["memory_margin"] * gb * 2**30 / ranks - size["states_bytes"]
            fit = max(0, int(room // max(1, size["activation_bytes_per_row"])))
            fits.append(fit)
        nodes[p.node.name] = {"memory_gb": gb, "memory": "gpu" if gpu else "ram", "ranks": p.nproc, "fits": fit}
    plan = {"nodes": nodes, "world": world}
    if fits and min(fits) > 0:
        total = size.get("global_batch_size") or 0
        batch, accum = split_global_batch(min(fits), world, total if total % world == 0 else 0,
                                          size.get("grad_accum") or 1)
        plan.update(batch_size=batch, grad_accum=accum, global_batch_size=batch * accum * world)
    return plan


def _dry_run(opts: LaunchOptions, as_json: bool, console: Console, err: Console | None = None,
            advice: links.Advice | None = None, choice: str = "") -> int:
    prep = prepare(opts, console)
    size = model_size(opts, sum(p.nproc for p in prep.plans))
    auto = auto_batch_plan(size, prep)
    link = links.warn(advice, err or console)
    if as_json:
        console.print_json(json.dumps({**dry_run_json(prep), "model": size, **({"model_choice": choice} if choice else {}),
                                       **({"auto_batch": auto} if auto else {}),
                                       **({"link": link} if opts.module == TRAINER else {})}))
        return 0
    for line in dry_run_text(prep):
        console.print(escape(line), highlight=False, soft_wrap=True)
    gib = 1 << 30
    if choice:
        console.print(f"# model: {escape(choice)}", highlight=False, soft_wrap=True)
    if size and auto:
        console.print(f"# model {size['name']}: {size['parameters'] / 1e6:.2f}M parameters; per rank about "
                      f"{size['states_bytes'] / gib:.2f} GiB of weights, gradients and optimizer states, and "
                      f"{size['activation_bytes_per_row'] / 2**20:.1f} MiB of activations a row", highlight=False,
                      soft_wrap=True)
        for name, n in auto["nodes"].items():
            if n["fits"] is None:
                console.print(f"# {name}: batch_size=auto: its memory is unknown (the probe did not say); its ranks "
                              f"measure at start", highlight=False, soft_wrap=True)
                continue
            where = f"{n['memory_gb']:g} GiB GPU memory" if n["memory"] == "gpu" else \
                f"{n['memory_gb']:g} GiB RAM available" + (f" / {n['ranks']} ranks" if n["ranks"] > 1 else "")
            console.print(f"# {name}: batch_size=auto: about {n['fits']} rows per rank fit ({size['memory_margin']:.0%} of "
                          f"{where}; estimated, each rank measures at start)", highlight=False, soft_wrap=True)
        if "batch_size" in auto:
            console.print(f"# batch_size=auto plan: {auto['batch_size']} x accum {auto['grad_accum']} x "
                          f"{auto['world']} ranks = {auto['global_batch_size']}", highlight=False, soft_wrap=True)
        elif any(n["fits"] == 0 for n in auto["nodes"].values()):
            console.print("# batch_size=auto: not even one row fits on a node by this estimate", highlight=False,
                          soft_wrap=True)
    elif size:
        console.print(f"# model {size['name']}: {size['parameters'] / 1e6:.2f}M parameters; per rank about "
                      f"{size['total_bytes'] / gib:.2f} GiB ({size['states_bytes'] / gib:.2f} weights, gradients and "
                      f"optimizer states, {size['activation_bytes'] / gib:.2f} activations at batch "
                      f"{size['batch_size']} per rank)", highlight=False, soft_wrap=True)
    return 0


def _sync_data(opts: LaunchOptions, console: Console) -> None:
    from cli.sync.run import sync_nodes

    remote = [n for n in opts.nodes if not n.is_local]
    if not remote:
        return
    console.print(f"[bold]hrmctl[/bold] syncing the dataset to {', '.join(n.name for n in remote)}", highlight=False)
    report = sync_nodes(remote, console=console, accept_new_host_keys=opts.accept_new_host_keys)
    report.raise_for_errors()


def plan_then_run(opts: LaunchOptions, console: Console, before_run=None) -> tuple[Prepared, RunResult]:
    """The command's flow: the plan (preflight included), then the run on every node; the report is the caller's.
    The run may ask for the plan again, once, when a first launch's guessed facts were wrong on a node.
    ``before_run()`` is called between the two (train's warning about the link)."""
    prep = prepare(opts, console)
    if before_run:
        before_run()

    def replan() -> Prepared:
        return prepare(dataclasses.replace(opts, run_id=prep.run_id), console)

    return prep, run(opts, prep, console, replan)


def train(opts: LaunchOptions, *, sync_data: bool, as_json: bool, console: Console, err: Console,
          own_options: list[str] = ()) -> int:
    """``own_options``: hrmctl train's, for the "did you mean" of an unknown one."""
    if opts.module == TRAINER:
        _read_guide_options(opts, err, list(own_options))
    else:
        _reject_options(opts.args, "trainer overrides are key=value", own_options)
    opts.args = expand_config_files(opts.module, opts.args)
    choice = _model_choice(opts)
    if choice and not (opts.dry_run and not as_json):  # the dry run's text says it with the model's size
        err.print(f"model: {choice}", markup=False, highlight=False, soft_wrap=True)
    advice = links.start(opts)  # test-ddp's figures for these nodes, if any: sized beside the preflight
    if opts.dry_run:
        return _dry_run(opts, as_json, console, err, advice, choice)
    opts.json_output = as_json
    if sync_data:
        _sync_data(opts, console)
    link: list[dict | None] = [None]

    def before_run() -> None:
        link[0] = links.warn(advice, err)

    prep, result = plan_then_run(opts, console, before_run)
    return _finish(result, prep, as_json, console, err, extra={"link": link[0]})


def _finish(result, prep, as_json: bool, console: Console, err: Console, extra: dict | None = None) -> int:
    if as_json:
        doc = {"run_id": prep.run_id, "exit_code": result.code, "ok": result.code == 0, "reason": result.reason,
               "failed_node": result.failed_node, "failed_rank": result.failed_rank, "seconds": round(result.seconds, 3),
               "left_running": result.left_running, **(extra or {})}
        console.print_json(json.dumps(doc))
    if result.code == 0:
        if not as_json:
            console.print(f"[green]done[/green] {escape(summary_line(result))}", highlight=False)
        return 0
    err.print(f"{'' if result.interrupted else 'error: '}{summary_line(result)}; logs in runs/{prep.run_id}/",
              markup=False, highlight=False,
              soft_wrap=True)
    return result.code


def test_ddp(opts: LaunchOptions, *, overrides: list[str] | None = None, as_json: bool, console: Console,
             err: Console, own_options: list[str] = ()) -> int:
    if overrides:  # the model to time: checked by the trainer's parser here, before anything starts
        _reject_options(overrides, "the model's overrides are key=value", own_options)
        check_trainer_args(TRAINER, overrides)
    if opts.dry_run:
        return _dry_run(opts, as_json, console)
    results: list[dict] = []

    def on_result(node: str, payload: str) -> None:
        try:
            results.append(json.loads(payload))
        except ValueError:
            pass

    opts.result_tag, opts.on_result, opts.quiet, opts.json_output = RESULT_TAG, on_result, as_json, as_json
    prep, result = plan_then_run(opts, console)
    if results and not as_json:
        from cli.launch.ddp_report import show
        show(results[-1], console)
    report = results[-1] if results else None
    if report is not None and not report.get("ok") and result.code == 0:
        result.code, result.reason = 1, "a collective gave a wrong result"
    saved = links.remember(report, opts.nodes) if result.code == 0 else None
    if saved and not as_json:
        console.print(f"[dim]saved for `hrmctl train --nodes {','.join(n.name for n in opts.nodes)}`: {escape(str(saved))}"
                      f"[/dim]", highlight=False, soft_wrap=True)
    return _finish(result, prep, as_json, console, err, extra={"result": report, "link_cache": saved and str(saved)})


def ddp_check_args(*, min_size: str, max_size: str, seconds: float, soak: float, no_bandwidth: bool,
                   overrides: list[str] | None = None) -> list[str]:
    args = ["--no-table", "--min-size", min_size, "--max-size", max_size, "--seconds", str(seconds)]
    if soak:
        args += ["--soak", str(soak)]
    if no_bandwidth:
        args.append("--no-bandwidth")
    return args + list(overrides or [])

