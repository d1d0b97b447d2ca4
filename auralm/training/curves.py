"""A run's curves: its metrics.jsonl read (each step once, a restart's repeated steps dropped) and drawn.

Pure: the standard library, and matplotlib only when drawing (a Figure on the Agg canvas: no pyplot, no display,
no global backend switched); no torch, nothing else of the trainer, so it is cheap to import. Two users:
  - the trainer's rank 0, at the end of a run: ``write_run_curves(out_dir, say)`` writes ``curves.png`` beside
    ``metrics.jsonl`` (loss and val_loss against step above, the learning rate below). Without matplotlib it says
    so in one line and writes nothing; a run never fails for its picture;
  - ``hrmctl plot`` (cli/runs/plot.py) imports it for the same reading and drawing of one or several runs.
``python -m auralm.training.curves RUN_DIR [...]`` writes (again) the curves.png of finished runs.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Callable, Sequence

METRICS = "metrics.jsonl"
CURVES = "curves.png"
# the x axes: step always; training time (train_s); cumulated tokens or samples from the logged rates
X_LABELS = {"step": "step", "time": "training time (s)", "tokens": "tokens", "samples": "samples"}
RATE_KEYS = {"tokens": "tokens_per_s", "samples": "samples_per_s"}
NOT_METRICS = ("step",)


def number(value) -> float | None:
    """A finite number, else None (a NaN loss is logged as null; booleans are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def clean(records: Sequence[dict]) -> list[dict]:
    """In step order, each step once. A run restarted from a checkpoint logs again the steps after that checkpoint:
    the later records (the ones the final weights come from) win."""
    kept: list[dict] = []
    for r in records:
        while kept and kept[-1]["step"] >= r["step"]:
            kept.pop()
        kept.append(r)
    return kept


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of RUN_DIR/metrics.jsonl, cleaned; [] when there is none. A line that is not a JSON object with an
    integer step (the one a running trainer is writing, say) is skipped."""
    try:
        text = (Path(run_dir) / METRICS).read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return []
    records = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step"), int) and not isinstance(rec["step"], bool):
            records.append(rec)
    return clean(records)


def metric_names(records: Sequence[dict]) -> list[str]:
    """The keys that hold a number in at least one record, in the order they first appear."""
    seen: dict[str, None] = {}
    for r in records:
        for k, v in r.items():
            if k not in seen and k not in NOT_METRICS and number(v) is not None:
                seen[k] = None
    return list(seen)


def x_axes(records: Sequence[dict]) -> list[str]:
    """The x axes these records can give: step, and time, tokens or samples when they were logged."""
    axes = ["step"]
    if any(number(r.get("train_s")) is not None for r in records):
        axes.append("time")
        axes += [x for x, key in RATE_KEYS.items() if any(number(r.get(key)) is not None for r in records)]
    return axes


def x_values(records: Sequence[dict], x: str = "step") -> list[float | None]:
    """Each record's x. Tokens (or samples) are cumulated from the logged rate: the trainer's rate is the units of
    the whole world trained since the previous record divided by the training time between them (train_s, which
    leaves out evaluations and checkpoints), so rate x (difference of train_s) is exactly those units."""
    if x == "step":
        return [float(r["step"]) for r in records]
    if x == "time":
        return [number(r.get("train_s")) for r in records]
    if x not in RATE_KEYS:
        raise ValueError(f"unknown x axis {x!r}: choose one of {', '.join(X_LABELS)}")
    out: list[float | None] = []
    total, before = 0.0, 0.0
    for r in records:
        rate, t = number(r.get(RATE_KEYS[x])), number(r.get("train_s"))
        if rate is None or t is None:
            out.append(None)
            continue
        total += rate * max(t - before, 0.0)
        before = t
        out.append(total)
    return out


def series(records: Sequence[dict], metric: str, x: str = "step") -> tuple[list[float], list[float]]:
    """The points (x, metric) where both are finite numbers."""
    xs, ys = [], []
    for xv, r in zip(x_values(records, x), records):
        y = number(r.get(metric))
        if xv is not None and y is not None:
            xs.append(xv)
            ys.append(y)
    return xs, ys


# ---------------------------------------------------------------- drawing (matplotlib, imported here only)


def _figure(width: float, height: float):
    from matplotlib.figure import Figure  # ImportError when matplotlib is missing: the caller's to say

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _log_scale(ax, values: Sequence[float]) -> None:
    """A logarithmic y axis for positive values spanning more than a factor of 20 (a loss falling for long)."""
    if values and min(values) > 0 and max(values) / min(values) > 20:
        ax.set_yscale("log")


def _marker(n: int) -> str | None:
    return "o" if n <= 30 else None  # few points (an evaluation every N steps): show each one


def save(fig, out: str | Path) -> Path:
    """The figure as a PNG at OUT, atomically (a temporary name, then renamed)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        fig.savefig(tmp, format="png")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def draw(curves: Sequence[tuple[str, Sequence[float], Sequence[float]]], metric: str, out: str | Path,
         x: str = "step", title: str | None = None) -> Path:
    """One line per (label, xs, ys), a legend when there is more than one, into the PNG at OUT."""
    fig = _figure(9, 5.2)
    ax = fig.add_subplot()
    every = []
    for label, xs, ys in curves:
        ax.plot(xs, ys, label=label, linewidth=1.5, marker=_marker(len(xs)), markersize=3.5)
        every += ys
    _log_scale(ax, every)
    ax.set_xlabel(X_LABELS.get(x, x))
    ax.set_ylabel(metric)
    ax.grid(True, alpha=0.3)
    if title:
        ax.set_title(title)
    if len(curves) > 1 or (curves and curves[0][0]):
        ax.legend(loc="best", fontsize="small")
    return save(fig, out)


def run_title(run_dir: Path) -> str:
    """The run directory's name, with the model and task of its config.json when there is one."""
    try:
        cfg = json.loads((run_dir / "config.json").read_text())
        return f"{run_dir.name}: {cfg['model']['name']} on {cfg['task']}"
    except (OSError, ValueError, KeyError, TypeError):
        return run_dir.name


def draw_run(records: Sequence[dict], out: str | Path, title: str = "") -> Path:
    """A run's picture: loss (and val_loss, when evaluated) against step above, the learning rate below."""
    fig = _figure(9, 6.5)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1.2])
    shown = []
    for metric, style in (("loss", {"linewidth": 1.2}), ("val_loss", {"linewidth": 1.6})):
        xs, ys = series(records, metric)
        if xs:
            top.plot(xs, ys, label=metric, marker=_marker(len(xs)) if metric == "val_loss" else None,
                     markersize=4, **style)
            shown += ys
    _log_scale(top, shown)
    top.set_ylabel("loss")
    top.grid(True, alpha=0.3)
    if shown:
        top.legend(loc="best", fontsize="small")
    xs, ys = series(records, "lr")
    bottom.plot(xs, ys, color="tab:green", linewidth=1.2)
    bottom.set_ylabel("lr")
    bottom.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    bottom.set_xlabel("step")
    bottom.grid(True, alpha=0.3)
    if title:
        fig.suptitle(title)
    return save(fig, out)


def write_run_curves(run_dir: str | Path | None, say: Callable[[str], None] = print) -> Path | None:
    """RUN_DIR/curves.png from RUN_DIR/metrics.jsonl; None (and one line through ``say``) when it cannot be drawn.
    No run directory (a rank other than 0): nothing, silently. Never raises: the run is more than its picture."""
    if run_dir is None:
        return None
    run_dir = Path(run_dir)
    try:
        records = read_metrics(run_dir)
        if not records:
            say(f"no {CURVES}: {run_dir / METRICS} has no records")
            return None
        path = draw_run(records, run_dir / CURVES, run_title(run_dir))
    except ImportError as exc:
        name = getattr(exc, "name", None) or "matplotlib"
        say(f"no {CURVES}: {name} is not installed on this node ({exc}); `pip install matplotlib` for the picture")
        return None
    except Exception as exc:  # noqa: BLE001 - a picture that fails must not fail the finished run
        say(f"no {CURVES}: {type(exc).__name__}: {exc}")
        return None
    say(f"curves: {path}")
    return path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or any(a in ("-h", "--help") for a in args):
        print("usage: python -m auralm.training.curves RUN_DIR [RUN_DIR ...]: write each run's curves.png again")
        return 0 if args else 2
    bad = 0
    for a in args:
        bad += write_run_curves(a, lambda line: print(line, file=sys.stderr)) is None
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
