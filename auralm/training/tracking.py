"""Where rank 0's metrics go besides ``metrics.jsonl``: TensorBoard event files and Weights & Biases.

``logging.tensorboard=true`` writes event files into ``<run>/tensorboard/`` (``tensorboard --logdir runs``);
``logging.wandb.project=NAME`` (with ``logging.wandb.entity`` and ``logging.wandb.mode=auto|online|offline``)
logs to W&B. Neither package is needed unless asked for: ``plan`` (rank 0, at the trainer's start, before
anything is trained or written) imports what was asked for and turns a missing package into one UserError
saying what to install. RunLog (auralm.training.runlog) opens the sinks when the run directory is first written and
gives each of them every metrics record; each sink has ``log(record, step)`` and ``close(failed)``.

The records' keys become the names these tools' users know (``NAMES``): ``train/loss``, ``train/lr``,
``eval/loss``, ``eval/exact_accuracy``, ... ; a key with a ``/`` (``mhc/amax_pre``) is kept as it is; any other
number goes under ``train/``. Lists (``halted_by_rank``) and texts are left to metrics.jsonl.
"""

from __future__ import annotations

import importlib
import json
import netrc
import os
import secrets
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from auralm.errors import UserError

NAMES = {
    "loss": "train/loss",
    "lm_loss": "train/lm_loss",
    "lr": "train/lr",
    "grad_norm": "grad_norm",
    "tokens_per_s": "train/tokens_per_s",
    "samples_per_s": "train/samples_per_s",
    "train_s": "train/seconds",  # training time so far, without evaluations and saving
    # the HRM/TRM ACT metrics (auralm.training.objective.Meter)
    "train_accuracy": "train/accuracy",
    "train_exact_accuracy": "train/exact_accuracy",
    "q_halt_loss": "train/q_halt_loss",
    "q_continue_loss": "train/q_continue_loss",
    "q_halt_accuracy": "train/q_halt_accuracy",
    "ponder": "train/ponder",
    "h_updates": "train/h_updates",
    "l_steps": "train/l_steps",
    # evaluations (auralm.tools.evaluate)
    "val_loss": "eval/loss",
    "exact_accuracy": "eval/exact_accuracy",
    "cell_acc": "eval/cell_accuracy",
    "token_acc": "eval/token_accuracy",
    # this rank's memory (auralm.training.train.memory_record)
    "rss_gb": "memory/rss_gb",
    "cuda_peak_gb": "memory/cuda_peak_gb",
    "cuda_allocated_gb": "memory/cuda_allocated_gb",
    "cuda_reserved_gb": "memory/cuda_reserved_gb",
}
MODES = ("auto", "online", "offline")
ENV_MODES = {"online": "online", "run": "online", "offline": "offline", "dryrun": "offline", "disabled": "disabled"}


def scalars(record: dict) -> dict[str, float]:
    """A metrics record's numbers under their tracking names (``step`` is the step, not a metric)."""
    out = {}
    for key, value in record.items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        out[NAMES.get(key, key if "/" in key else f"train/{key}")] = float(value)
    return out


# ---------------------------------------------------------------- the start: what was asked for, and can it work


@dataclass
class Plan:
    """What rank 0 will open, decided at the start."""
    tensorboard: bool = False
    wandb_project: str = ""  # "": no W&B
    wandb_entity: str = ""
    wandb_mode: str = ""  # online, offline (or disabled, from WANDB_MODE)
    wandb_why: str = ""  # why that mode, for the log

    @property
    def empty(self) -> bool:
        return not self.tensorboard and not self.wandb_project


MODULES = {"tensorboard": "torch.utils.tensorboard", "wandb": "wandb"}  # the package: what the sink imports


def packages(logging) -> list[tuple[str, str]]:
    """What ``cfg.logging`` needs on rank 0's node, as (the key that asks for it, the package): checked by hrmctl's
    preflight against the master's probe (cli/launch/preflight/prepare.py), before launch; imported by ``plan``."""
    asked = {"tensorboard": ("logging.tensorboard=true", logging.tensorboard),
             "wandb": ("logging.wandb.project", bool(logging.wandb.project))}
    return [(key, pkg) for pkg, (key, on) in asked.items() if on]


def missing_line(keys: list[str], missing: list[str]) -> str:
    """``logging.wandb.project needs the wandb package``: the start of the line that refuses it."""
    return (f"{' and '.join(keys)} need{'s' if len(keys) == 1 else ''} the {' and '.join(missing)} "
            f"package{'s' if len(missing) > 1 else ''}")


def plan(logging) -> Plan:
    """Check ``cfg.logging`` (auralm.training.config.LoggingConfig) on rank 0 before anything is trained: the packages
    asked
    for import, W&B's mode is known. Any problem is one UserError (the trainer exits with status 2)."""
    w = logging.wandb
    if w.mode not in MODES:
        raise UserError(f"logging.wandb.mode={w.mode!r}: expected one of {', '.join(MODES)}")
    if not w.project and (w.entity or w.mode != "auto"):
        given = "logging.wandb.entity" if w.entity else "logging.wandb.mode"
        raise UserError(f"{given} is set but logging.wandb.project is not: logging.wandb.project=NAME turns W&B on")
    missing, broken = [], []
    for _, pkg in packages(logging):
        _try_import(pkg, MODULES[pkg], missing, broken)
    if missing:
        raise UserError(f"{missing_line([k for k, pkg in packages(logging) if pkg in missing], missing)}, not "
                        f"installed here: pip install {' '.join(missing)}")
    if broken:
        pkg, why = broken[0]
        raise UserError(f"the {pkg} package is installed but does not import: {why}; reinstall it "
                        f"(pip install --force-reinstall {pkg})")
    p = Plan(tensorboard=logging.tensorboard, wandb_project=w.project, wandb_entity=w.entity)
    if w.project:
        p.wandb_mode, p.wandb_why = wandb_mode(w.mode)
        if p.wandb_mode == "online" and not logged_in(api_host()[0]):
            raise UserError("logging.wandb.mode=online, but W&B has no API key on this machine: run `wandb login` "
                            "(or set WANDB_API_KEY), or use logging.wandb.mode=offline and `wandb sync` later")
    return p


def _try_import(pkg: str, module: str, missing: list, broken: list) -> None:
    try:
        importlib.import_module(module)
    except ImportError as e:
        if (e.name or "").split(".")[0] == pkg:
            missing.append(pkg)
        else:  # the package is there, something it needs is not
            broken.append((pkg, _first_line(e)))
    except Exception as e:  # e.g. a protobuf that does not match the package
        broken.append((pkg, _first_line(e)))


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def api_host() -> tuple[str, int]:
    """W&B's server: api.wandb.ai:443, or WANDB_BASE_URL's (a self-hosted server)."""
    url = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai")
    return url.hostname or "api.wandb.ai", url.port or (80 if url.scheme == "http" else 443)


def wandb_mode(configured: str) -> tuple[str, str]:
    """The W&B mode for this run and why: the key when it says online or offline; at ``auto``, WANDB_MODE when
    set, else online only when W&B's server answers within a second and this machine has an API key."""
    if configured != "auto":
        return configured, f"logging.wandb.mode={configured}"
    env = os.environ.get("WANDB_MODE", "").strip().lower()
    if env:
        if env not in ENV_MODES:
            raise UserError(f"WANDB_MODE={env!r}: expected online, offline or disabled")
        return ENV_MODES[env], f"WANDB_MODE={env}"
    host, port = api_host()
    if not reachable(host, port):
        return "offline", f"no connection to {host}:{port} within 1 s"
    if not logged_in(host):
        return "offline", "no W&B API key here (`wandb login` or WANDB_API_KEY)"
    return "online", f"{host} answers"


def reachable(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether a TCP connection to host:port opens within ``timeout`` seconds, the name lookup included."""
    ok = []

    def attempt():
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            ok.append(True)
        except OSError:
            pass

    t = threading.Thread(target=attempt, daemon=True)  # a hanging DNS lookup is left behind, not waited for
    t.start()
    t.join(timeout)
    return bool(ok)


def logged_in(host: str) -> bool:
    """Whether W&B has an API key here: WANDB_API_KEY, or ``wandb login``'s entry in ~/.netrc."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc(os.environ.get("NETRC") or None).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


# ---------------------------------------------------------------- the sinks


class TensorBoardSink:
    """Event files in ``<run>/tensorboard/``, flushed at every record (what metrics.jsonl has, they have). A resumed
    run continues in the same directory; events at or after the resumed step from the earlier attempt are
    hidden by TensorBoard (``purge_step``)."""

    name = "TensorBoard"

    def __init__(self, out_dir: Path, config: dict, step: int):
        from torch.utils.tensorboard import SummaryWriter

        self.dir = out_dir / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(self.dir), purge_step=step + 1 if step else None)
        if not step:
            self.writer.add_text("config", "```\n" + json.dumps(config, indent=2) + "\n```", 0)

    def log(self, record: dict, step: int) -> None:
        for name, value in scalars(record).items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self, failed: bool = False) -> None:
        self.writer.close()


class WandbSink:
    """A W&B run named after the run directory, with the resolved config. Its files go to ``<run>/wandb/`` unless
    WANDB_DIR says elsewhere. The run's id is kept in ``<run>/wandb-run-id`` so that a resumed training continues
    the same W&B run. Online mode that fails to start falls back to offline, with a line saying so."""

    name = "W&B"
    ID_FILE = "wandb-run-id"

    def __init__(self, p: Plan, out_dir: Path, config: dict, step: int, say):
        import wandb

        id_file = out_dir / self.ID_FILE
        run_id = id_file.read_text().strip() if step and id_file.exists() else ""
        kwargs = dict(project=p.wandb_project, entity=p.wandb_entity or None, name=out_dir.name, config=config,
                      id=run_id or new_run_id(), resume="allow" if run_id else None,
                      settings=wandb.Settings(console="off", silent=True))
        if not os.environ.get("WANDB_DIR"):
            kwargs["dir"] = str(out_dir)
        mode, why = p.wandb_mode, p.wandb_why
        try:
            self.run = wandb.init(mode=mode, **kwargs)
        except Exception as e:
            if mode != "online":
                raise
            mode, why = "offline", f"online failed: {_first_line(e)}"
            self.run = wandb.init(mode=mode, **kwargs)
        id_file.write_text(kwargs["id"] + "\n")
        if mode == "offline":
            say(f"W&B: offline ({why}); `wandb sync {self.sync_dir()}` uploads it later")
        elif mode == "online":
            say(f"W&B: {self.run.url or p.wandb_project}")
        else:
            say(f"W&B: {mode} ({why})")

    def sync_dir(self) -> str:
        """The run's offline directory (``.../wandb/offline-run-<time>-<id>``), what ``wandb sync`` takes."""
        where = getattr(self.run.settings, "sync_dir", None)
        return str(where or Path(self.run.dir).parent)

    def log(self, record: dict, step: int) -> None:
        self.run.log(scalars(record), step=step)

    def close(self, failed: bool = False) -> None:
        import wandb

        self.run.finish(exit_code=1 if failed else 0)
        # finish() returns before wandb's service process has written everything (the run's .wandb file, and an
        # online run's uploads); teardown waits for it. wandb does this in an atexit hook, which the trainer's
        # process never reaches (it leaves with os._exit).
        wandb.teardown(exit_code=1 if failed else 0)


def open_sinks(p: Plan, out_dir: Path, config: dict, step: int, say) -> list:
    """Rank 0, when the run directory is first written: the sinks of the plan. ``step``: where training starts
    (a resumed run's step, else 0).

    A sink that cannot start is a warning line, not the end of the training: only rank 0 opens sinks, and an
    error there would leave the other ranks waiting for it until dist_timeout; metrics.jsonl has everything."""
    sinks: list = []
    for wanted, name, make in ((p.tensorboard, "TensorBoard", lambda: TensorBoardSink(out_dir, config, step)),
                               (p.wandb_project, "W&B", lambda: WandbSink(p, out_dir, config, step, say))):
        if wanted:
            try:
                sinks.append(make())
            except Exception as e:
                say(f"warning: {name} logging did not start ({type(e).__name__}: {_first_line(e)}); the metrics "
                    f"are in metrics.jsonl", err=True)
    return sinks


def new_run_id() -> str:
    """A W&B run id (8 lowercase letters and digits), without touching the random module's state."""
    return "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(8))
