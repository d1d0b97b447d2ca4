"""The guides' spellings and ours, in one table.

Our users arrive with a guide: the HRM and TRM repositories' ``pretrain.py`` lines, the RLM-mHC guide's keys and
YAML files, the HRM distributed launcher's ``--options``, AuraLM's ``train_gpt2_spanish.py``, torchrun's. Each row of
:data:`TABLE` is one spelling of a guide and what it is here: a key of the trainer (``training.lr``), an option of
``hrmctl train`` (``--dry-run``) or of ``hrmctl prepare-data`` (``command="prepare-data"``: ``--max-tokens``, or
``SOURCE``, its positional argument), accepted as it is (``accepted``: what hrmctl does anyway, said), or nothing
(then ``note`` says what to do instead). The key spellings are read as ours by :mod:`auralm.guides.translate`
before the trainer's config sees them; ``hrmctl train`` takes the option spellings (cli/launch/plan/guide_options.py),
``hrmctl prepare-data`` its own (cli/tools/prepare_data.py, before its options are parsed); all of them name their
nearest row in a "did you mean" (:func:`suggest`). docs/guides.md is this table, per guide, with the lines it comes
from. Imports the standard library only: hrmctl's options read it without the trainer.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

HRM = "the HRM guide's pretrain.py"
TRM = "the TRM guide's pretrain.py"
RLM = "the RLM-mHC guide"
LAUNCHER = "the HRM distributed launcher"
AURALM = "AuraLM's train_gpt2_spanish.py"
SUDOKU_BUILDER = "the HRM guide's build_sudoku_dataset.py"
TORCHRUN = "torchrun"
TRAIN, PREPARE = "train", "prepare-data"  # the hrmctl command a row's option belongs to
AURALM_MODEL = "model=124m task=lm"  # AuraLM's GPT-2 Spanish is GPT-2 small: 124M parameters (its --seq-len sets the context)
SOURCE = "SOURCE"  # prepare-data's positional argument, as a row's ``ours``


@dataclass(frozen=True)
class Spelling:
    theirs: str  # as the guide types it: a key (``lr``) or an option (``--learning_rate``)
    ours: str  # our key, or an option of hrmctl train (``--dry-run``); "": none (see note)
    guide: str
    note: str = ""  # what it means here, or (ours == "") what to do instead
    command: str = TRAIN  # an option's: the hrmctl command that reads it (train or prepare-data)
    flag: bool = False  # an option that takes no value (``--dry_run``)
    accepted: bool = False  # ours == "": taken as it is (hrmctl does it anyway: ``note`` says how), not refused
    per_gpu: bool = False  # a count of processes that each need a GPU (the launcher's --gpus N)
    implies: str = ""  # what the option means besides ours, unless the line gives it (``--task sudoku``, ``task=lm``)

    @property
    def is_option(self) -> bool:
        return self.theirs.startswith("-")


def _rows(guide: str, pairs: str) -> tuple[Spelling, ...]:
    """``"theirs ours, theirs ours"`` as rows of one guide."""
    return tuple(Spelling(*pair.split(), guide) for pair in pairs.split(",") if pair.strip())


TABLE: tuple[Spelling, ...] = (
    # the HRM and TRM repositories' pretrain.py (Hydra: ``arch.X`` is our ``model.X`` throughout, ``+key`` is key)
    *_rows(HRM, """arch.hidden_size model.n_embd, arch.num_heads model.n_head, arch.seq_len model.block_size,
        lr training.lr, puzzle_emb_lr training.puzzle_emb_lr, weight_decay training.weight_decay,
        puzzle_emb_weight_decay training.puzzle_emb_weight_decay, global_batch_size training.global_batch_size,
        epochs training.epochs, eval_interval training.eval_every_epochs, data_path data_dir, data_paths data_dir,
        lr_warmup_steps training.warmup_steps, lr_min_ratio training.min_lr_ratio, beta1 training.beta1,
        beta2 training.beta2, seed training.seed, checkpoint_path out_dir, run_name run_name"""),
    *_rows(TRM, "ema training.ema, ema_rate training.ema_decay"),
    # the RLM-mHC guide: its command lines and YAML files (finetune.yaml's optimizer and scheduler types included)
    *_rows(RLM, """model.hidden_dim model.n_embd, model.num_layers model.n_layer, model.num_heads model.n_head,
        model.max_seq_len model.block_size, data.max_length model.block_size,
        model.gradient_checkpointing training.grad_checkpoint, training.gradient_checkpointing training.grad_checkpoint,
        training.optimizer.type training.optimizer, training.optimizer.lr training.lr,
        training.optimizer.weight_decay training.weight_decay, training.scheduler.type training.schedule,
        training.scheduler.warmup_steps training.warmup_steps, training.scheduler.min_lr_ratio training.min_lr_ratio,
        training.gradient_accumulation_steps training.grad_accum, training.max_grad_norm training.grad_clip,
        training.save_steps training.checkpoint_interval, training.logging_steps training.log_interval,
        training.mixed_precision training.dtype, resume_from_checkpoint resume,
        training.wandb.project logging.wandb.project, training.wandb.entity logging.wandb.entity,
        training.wandb.mode logging.wandb.mode"""),
    # the HRM distributed launcher's options (argparse: ``--name value`` or ``--name=value``)
    Spelling("--model", "model", LAUNCHER, "50m and 100m are hrm-50m and hrm-100m, language models: task=lm"),
    Spelling("--task", "task", LAUNCHER),
    Spelling("--batch_size", "training.batch_size", LAUNCHER, "per rank and micro-step"),
    Spelling("--learning_rate", "training.lr", LAUNCHER),
    Spelling("--lr", "training.lr", LAUNCHER),
    Spelling("--max_steps", "training.max_steps", LAUNCHER),
    Spelling("--eval_steps", "training.eval_interval", LAUNCHER, "evaluate every N steps"),
    Spelling("--save_steps", "training.checkpoint_interval", LAUNCHER),
    Spelling("--warmup_steps", "training.warmup_steps", LAUNCHER),
    Spelling("--seed", "training.seed", LAUNCHER),
    Spelling("--data_dir", "data_dir", LAUNCHER),
    Spelling("--output_dir", "out_dir", LAUNCHER),
    Spelling("--dry_run", "--dry-run", LAUNCHER, flag=True),
    Spelling("--gpus", "--nproc", LAUNCHER, "one process per GPU: refused where a node has fewer GPUs", per_gpu=True),
    Spelling("--verbose", "", LAUNCHER,
             "hrmctl's log shows every rank's lines already, each node's whole output is in "
             "runs/<run-id>/<node>.log, and training.log_interval=N logs every N steps", flag=True, accepted=True),
    Spelling("--train_samples", "", LAUNCHER,
             "hrmctl trains on a prepared data directory: cap its size with `hrmctl prepare-data SOURCE --max-tokens "
             "N` (a token budget; with --streaming nothing more is read), and the training's length with "
             "training.max_steps=N or training.epochs=N"),
    # AuraLM's train_gpt2_spanish.py (argparse, dashes): GPT-2 on Spanish text, across two laptops; its options mean
    # its model, our GPT on text, unless the line names a model or task
    *(Spelling(theirs, ours, AURALM, note, flag=flag, implies=AURALM_MODEL) for theirs, ours, note, flag in (
        ("--batch-size", "training.batch_size", "per rank and micro-step", False),
        ("--seq-len", "model.block_size", "the model's context, in tokens", False),
        ("--distributed", "--nodes", "a run across machines: every node of the inventory, unless --nodes names them",
         True))),
    Spelling("--prepare", "", AURALM, "what hrmctl prepare-data does: hrmctl train refuses it with the prepare-data "
             "line to run first", command=PREPARE, flag=True, accepted=True),
    Spelling("--dataset-name", SOURCE, AURALM, "a dataset name (the Hugging Face cache) or a local file",
             command=PREPARE),
    Spelling("--dataset-max-tokens", "--max-tokens", AURALM, command=PREPARE),
    # the HRM guide's dataset/build_sudoku_dataset.py, typed after hrmctl prepare-data (--task sudoku implied)
    *(Spelling(theirs, ours, SUDOKU_BUILDER, note, command=PREPARE, implies="--task sudoku")
      for theirs, ours, note in (("--output-dir", "--out", ""), ("--subsample-size", "--train", "train puzzles"),
                                 ("--num-aug", "--aug", "augmented copies of each train puzzle"))),
    # torchrun's own: hrmctl starts torchrun on every node itself
    Spelling("--nproc_per_node", "--nproc", TORCHRUN),
    Spelling("--nproc-per-node", "--nproc", TORCHRUN),
    Spelling("--master_port", "--master-port", TORCHRUN),
    *(Spelling(o, "", TORCHRUN, "hrmctl sets it on every node from --nodes (the first is the master)")
      for o in ("--nnodes", "--node_rank", "--node-rank", "--master_addr", "--master-addr")),
)

# Our key for a guide's key (``arch.*`` beyond these is ``model.*``: auralm.guides.translate).
ALIASES: dict[str, str] = {s.theirs: s.ours for s in TABLE if not s.is_option}
# The options hrmctl train takes in a guide's spelling: ours is a trainer key or an option of hrmctl train.
OPTIONS: dict[str, Spelling] = {s.theirs: s for s in TABLE if s.is_option and s.command == TRAIN}
# The options hrmctl prepare-data takes in a guide's spelling: ours is an option of it, or SOURCE.
PREPARE_OPTIONS: dict[str, Spelling] = {s.theirs: s for s in TABLE if s.is_option and s.command == PREPARE}


def option_row(name: str, command: str = TRAIN) -> Spelling | None:
    """The row of an option as typed: its exact spelling, else the same words with other dashes or case
    (``--max-steps`` and ``--Max_Steps`` are the launcher's ``--max_steps``; argparse users type either)."""
    rows = OPTIONS if command == TRAIN else PREPARE_OPTIONS
    if name in rows:
        return rows[name]
    return next((s for s in rows.values() if normal(s.theirs) == normal(name)), None) if name.startswith("--") else None
# One key of a guide that sets two of ours: training.optimizer.betas=[0.9,0.95] (also (0.9, 0.95) or 0.9,0.95).
COMPOUND = {"training.optimizer.betas": ("training.beta1", "training.beta2")}
# Values in a guide's words, per key of ours they set. training.mixed_precision: accelerate's "no" is fp32 (and so
# is false, which is what YAML makes of an unquoted no); the optimizer and scheduler types of the Hugging Face
# Trainer (the RLM guide's finetune.yaml).
VALUES: dict[str, dict[str, str]] = {
    "training.mixed_precision": {"no": "fp32", "false": "fp32", "fp32": "fp32", "bf16": "bf16", "fp16": "fp16"},
    "training.optimizer.type": {"adamw": "adamw", "adamw_torch": "adamw", "adamw_torch_fused": "adamw",
                                "adamw_hf": "adamw", "adam_atan2": "adam_atan2", "adamatan2": "adam_atan2"},
    "training.scheduler.type": {"cosine": "cosine", "cosine_with_min_lr": "cosine", "linear": "linear",
                                "constant": "constant", "constant_with_warmup": "constant"},
}
# The HRM language-model launcher's ``--model 50m|100m``, as model names (language models: hrm-50m and hrm-100m train
# task=lm unless task= is given, auralm/models/hrm/spec.py).
MODEL_ALIASES = {"50m": "hrm-50m", "100m": "hrm-100m", "27m": "hrm-27m"}
# ``arch=NAME`` as in the guides: the paper's model of that family.
ARCH_NAMES = {"hrm": "hrm-27m", "hrm_v1": "hrm-27m", "trm": "trm-7m"}
# Keys the guides pass that only matter to their own tooling: accepted with these values only.
ACCEPTED = {"evaluators": ("[]",)}


def prepare_args(row: Spelling, value: str) -> list[str]:
    """A prepare-data row and its value as prepare-data's own arguments (``--dataset-name wikipedia``: ``wikipedia``,
    its SOURCE; ``--prepare``: nothing, that is what prepare-data does)."""
    if row.accepted:
        return []
    if row.ours == SOURCE:
        return [value]
    return [row.ours] if row.flag else [row.ours, value]


def normal(name: str) -> str:
    """A spelling without its decoration: ``--Learning-Rate`` and ``+learning_rate`` are ``learning_rate``."""
    return name.strip().lstrip("-+").replace("-", "_").lower()


def suggest(given: str, ours: list[str], *, option: bool = False, command: str = TRAIN) -> str:
    """The "did you mean" of an unknown key (``option=True``: an unknown option of hrmctl ``command``), as the
    message's tail `` (did you mean ...)``, or "" when nothing is near. A guide's spelling that differs only in
    dashes, case or its kind (``learning_rate=`` for the launcher's ``--learning_rate``) names ours for it; else the
    nearest of ``ours`` (our keys, or options) and the guides' spellings (of that command's options)."""
    word = normal(given)
    rows = [s for s in TABLE if s.command == command and (s.is_option or command == TRAIN)]
    same = [s for s in rows if normal(s.theirs) == word]
    elsewhere = [s for s in TABLE if s.command != command and normal(s.theirs) == word and s.ours]
    if not same and elsewhere:  # --batch_size given to prepare-data: hrmctl train's
        s = elsewhere[0]
        return f" ({s.guide}'s {s.theirs} is {s.ours} of hrmctl {s.command}, not of hrmctl {command})"
    if same:
        return _pointer(same[0], option, exact=True)
    if option:
        last = {k.rsplit(".", 1)[-1].lower(): k for k in ours if not k.startswith("-")}
        if word in last:  # --warmup_steps 10: our key of that name, as an override
            return f" (did you mean the override {last[word]}=VALUE?)"
    candidates: dict[str, str | Spelling] = {normal(s.theirs): s for s in rows if s.ours or s.is_option == option}
    candidates.update((normal(k), k) for k in ours)  # ours first where a guide writes the same word
    near = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6 if option else 0.5)
    if not near:
        return ""
    hit = candidates[near[0]]
    if isinstance(hit, Spelling):
        return _pointer(hit, option)
    if hit.startswith("-"):
        return f" (did you mean {hit}?)"
    return f" (did you mean the override {hit}=VALUE?)" if option else f" (did you mean {hit!r}?)"


def _pointer(s: Spelling, option: bool, exact: bool = False) -> str:
    """A row of the table as the answer to an unknown key or option (``exact``: the same word as typed)."""
    if not s.ours:
        return f" ({s.guide}'s {s.theirs} has no counterpart here: {s.note})"
    if s.ours.startswith("-"):
        return f" (did you mean {s.ours}? {s.guide}'s {s.theirs})"
    if exact and option:  # the guide's option where it is not taken (hrmctl test-ddp): our key
        return f" (did you mean the override {s.ours}=VALUE? {s.theirs} is {s.guide}'s spelling)"
    if s.is_option == option:  # the guide's own spelling, near what was typed
        return f" (did you mean {s.theirs if option else repr(s.theirs)}? {s.guide}'s spelling of {s.ours})"
    if option:  # a guide's key typed as an option
        return f" (did you mean the override {s.theirs}=VALUE? {s.guide}'s spelling of {s.ours})"
    return f" (did you mean {s.ours!r}? {s.theirs} is {s.guide}'s spelling)"
