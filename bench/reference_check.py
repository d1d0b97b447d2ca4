"""HRM and TRM against the public code: the same puzzles, batch order, initial weights and optimizer fed to the official
implementations and to ours, on the CPU, step by step (issue 66, item 2).

    python bench/reference_check.py --hrm DIR --trm DIR [--steps 200] [--family hrm|trm|trm-att|trm-mlp|both]
                                    [--json] [--classes published|matched|both] [--no-floor] [--out FILE]
                                    [--width 96] [--batch 32] [--halt-max-steps 8] [--lr 1e-4] [--threads 1]
                                    [--dtype float32|float64]

DIR is a checkout of github.com/sapientinc/HRM (``--hrm``) or github.com/SamsungSAILMontreal/TinyRecursiveModels
(``--trm``); their modules are imported from there (``models.hrm.hrm_act_v1``, ``models.recursive_reasoning.trm``,
``models.losses``, ``models.sparse_embedding``), never copied into this project. Their ``pretrain.py`` is not run (it
needs CUDA, AdamATan2, Hydra and W&B): this script does what its ``train_batch`` does, on the CPU.

The models (``--family trm`` runs both of TRM's Sudoku variants), at our recipes' settings scaled down:
  hrm      recipe=hrm-sudoku (post-norm, rotary, stablemax, Q-continue target) at width 96, 2 heads, H and L 2 layers,
           2 x 2 cycles, 8 segments at most, the puzzle embedding one position of 96 numbers;
  trm-att  recipe=trm-sudoku-att (16 puzzle-embedding positions, halting on q_halt > 0) at width 96, 2 heads,
           2 layers, T = 2, n = 2, 8 segments at most;
  trm-mlp  recipe=trm-sudoku-mlp (the MLP over the 97 positions, no position encoding), the same sizes.
The width is 96 because both round the SwiGLU's hidden width there alike (256); below 512 ours rounds to 64
(hrm-tiny's 128 gives 384 where theirs gives 512), from 512 on to 256 as theirs.

Both get: the same initial weights (theirs, copied into ours by a name map checked to cover every parameter and
persistent buffer of both, shapes equal); the same batches in the same order (generated medium puzzles, 30-36 givens,
``auralm.data.datadir.Puzzles`` as our trainer reads them, converted to their dataset's layout: inputs the cell + 1
(1 = blank), labels the digit + 1, puzzle identifier 0, vocabulary 11); torch's AdamW on both sides with the same
lr, betas (0.9, 0.95) and weight decay (theirs would be AdamATan2, not installed here; ours training.optimizer=adamw),
their puzzle embedding under their own ``CastedSparseEmbeddingSignSGD_Distributed`` (world size 1) and ours under
``training.puzzle_emb_optimizer=sign_sgd``; a constant learning rate (the recipes' 2000 warm-up steps would hold it
under a tenth over 200 steps); halting exploration on (0.1, the papers') with the same random draws on both sides
(torch's global generator seeded alike before each side's step: ``rand``/``randint`` and their ``rand_like``/
``randint_like`` draw the same numbers). Our side is our own code: ``auralm.models.build``, the trainer's
``objective`` (carry, targets, loss) and ``optim.make_optimizer``/``lr_at``.

``--classes``: ``published`` compares their model as published, whose head has 11 classes (PAD, blank, the digits),
against ours under the recipes' ``model.extra_classes=2`` (the 9 digits, then two classes no target has: their rows
PAD and blank copied there); ``matched`` (a diagnostic) holds their two never-target logits at -1e12 and gives ours
``model.extra_classes=0``, so that both normalise over the same 9 classes. ``both`` (the default) runs each.
The noise floor (``--no-floor`` skips it): their code against itself, the second copy's initial weights multiplied by
(1 + 1e-7 N(0, 1)), 1e-15 under ``--dtype float64``, on the same batches: how far rounding alone carries the losses
apart over the same steps.

Differences found (issue 66; docs/hrm.md "Checked against the public code"):
  - their head has 11 classes, ours the task's 9 (dataset/build_sudoku_dataset.py ``vocab_size=10 + 1``, ``arr + 1``;
    models/*: ``lm_head = CastedLinear(hidden_size, vocab_size)``; ours auralm/tasks/sudoku ``classes()`` 9): the
    recipes now set ``model.extra_classes=2`` (two outputs after the digits that no target has, as their PAD and
    blank), which closed the 8.8-14.6% gap of ``--classes published``;
  - their AdamATan2 takes ``model.parameters()`` with weight decay on all (pretrain.py ``create_model``), ours none on
    vectors (auralm/training/optim.py ``make_optimizer``: here the Q-head's bias): the recipes now set
    ``training.decay_vectors=true``;
  - TRM's MLP over the positions (``mlp_t``): its hidden width rounded to 256 (models/layers.py ``SwiGLU``), ours to
    64 below 512 (97 positions: 512 against 320), and its post-norm taken over the positions (trm.py, the block's
    ``rms_norm`` between the two transposes), ours over the channels: both fixed in auralm/models/layers.py;
  - below width 512 our channel SwiGLU rounds its width to 64, theirs to 256 (the same from 512 on): a choice of ours
    for the tiny models; the width here, 96, rounds alike.

What had to change in theirs to run on a CPU (all done from this script, in this process; their files untouched):
  1. a module ``flash_attn_interface`` whose ``flash_attn_func`` calls
     ``torch.nn.functional.scaled_dot_product_attention``
     (HRM's models/layers.py imports FlashAttention 3, or 2; TRM's layers.py already uses SDPA);
  2. ``forward_dtype="float32"`` in their config (their default bfloat16; bf16 off, as ours);
  3. no ``torch.compile`` and no ``pretrain.py``: its ``create_model`` builds under ``torch.device("cuda")`` and its
     ``train_batch`` calls ``.cuda()``; the steps of ``train_batch`` (the carry, ``(1 / batch) * loss`` backward,
     each optimizer at its lr, ``zero_grad``) are done here on the CPU;
  4. AdamATan2 (the ``adam_atan2`` CUDA package) replaced by torch's AdamW with the same hyper-parameters;
  5. their data made in memory in their dataset's layout (their build_sudoku_dataset.py downloads from the HF hub).
Their model code itself needed no change: it creates every tensor on the default device.

``--dtype float64`` (a diagnostic of how much of a difference is float32 rounding): both sides in float64, weights,
optimizer states and activations. Ours rounds nowhere to float32 in a float64 run (its casts are "float32 or wider"),
and its halting exploration draws in the Q logits' type, as theirs does (``rand_like``); theirs is given
``forward_dtype=float64``, its weights made float64 after the init, and its model code read with every
``torch.float32`` made ``torch.float64`` (its RMSNorm, its Q-head's output and its cross-entropy cast to float32;
done in memory as it is imported, their files untouched). Rounding then starts 2^29 times smaller, and what TRM's
recursion amplifies over 200 steps is what the two implementations compute differently, if anything.

Exit status 1 when a check fails (name map, shapes, rotary tables) or a step's loss differs by more than 1%.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.machinery
import json
import math
import re
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from auralm import models, tasks  # noqa: E402
from auralm.data import sudoku  # noqa: E402
from auralm.data.datadir import Puzzles  # noqa: E402
from auralm.training import config, objective, optim  # noqa: E402

TOLERANCE = 0.01
PERTURB = {"float32": 1e-7, "float64": 1e-15}  # the noise floor's: about one rounding of each type
SHIMS = [
    "flash_attn_interface.flash_attn_func -> torch.nn.functional.scaled_dot_product_attention (HRM's models/layers.py)",
    "forward_dtype=float32 in their config (default bfloat16)",
    "no torch.compile and no pretrain.py (CUDA-only: torch.device('cuda'), .cuda()); its train_batch steps done here "
    "on the CPU",
    "AdamATan2 -> torch.optim.AdamW, same lr, betas and weight decay (on both sides)",
    "their sudoku dataset layout made in memory (inputs cell+1, labels digit+1, identifier 0, vocab 11)",
]
# their tensor name -> ours (regular expressions on the state_dict's names; \1 ... as re.sub)
LAYER_NAMES = [(r"self_attn\.qkv_proj\.", "attn.qkv."), (r"self_attn\.o_proj\.", "attn.out."),
               (r"mlp_t\.gate_up_proj\.", "mix_t.gate_up."), (r"mlp_t\.down_proj\.", "mix_t.down."),
               (r"mlp\.gate_up_proj\.", "mlp.gate_up."), (r"mlp\.down_proj\.", "mlp.down.")]


# ----------------------------------------------------------------------------------------------- their code, imported
def flash_attn_module() -> types.ModuleType:
    """``flash_attn_func(q, k, v, causal)`` on (batch, seq, heads, head_dim) tensors, by SDPA (the same scale)."""
    mod = types.ModuleType("flash_attn_interface")

    def flash_attn_func(q, k, v, causal=False, **_):
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
        return out.transpose(1, 2).contiguous()

    mod.flash_attn_func = flash_attn_func
    return mod


class _Float64Source(importlib.machinery.SourceFileLoader):
    """Their module compiled from its source with every ``torch.float32`` read as ``torch.float64`` (``--dtype
    float64``; never from a cached .pyc, their files untouched)."""

    def get_code(self, fullname):
        return compile(Path(self.path).read_text().replace("torch.float32", "torch.float64"), self.path, "exec",
                       dont_inherit=True)


class _Float64Models:
    """A meta-path finder: their package ``models`` from ``repo``, each of its modules through ``_Float64Source``."""

    def __init__(self, repo: Path):
        self.repo = repo

    def find_spec(self, name, path=None, target=None):
        if name != "models" and not name.startswith("models."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path or [str(self.repo)])
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            spec.loader = _Float64Source(name, spec.origin)
        return spec


def import_theirs(repo: Path, names: list[str], float64: bool = False) -> dict[str, types.ModuleType]:
    """Their modules from their checkout: both repositories call their package ``models``, so it is imported from one
    checkout, kept by reference, and dropped from ``sys.modules`` before the other's is imported. ``float64``: their
    source read with every ``torch.float32`` as ``torch.float64`` (``_Float64Source``)."""
    if not (repo / "models").is_dir():
        raise SystemExit(f"{repo}: not a checkout of the HRM or TRM repository (no models/ folder)")
    for key in [k for k in sys.modules if k == "models" or k.startswith("models.")]:
        del sys.modules[key]
    sys.modules.setdefault("flash_attn_interface", flash_attn_module())
    sys.path.insert(0, str(repo))
    finder = _Float64Models(repo) if float64 else None
    if finder:
        sys.meta_path.insert(0, finder)
    try:
        return {n: importlib.import_module(n) for n in names}
    finally:
        if finder:
            sys.meta_path.remove(finder)
        sys.path.remove(str(repo))
        for key in [k for k in sys.modules if k == "models" or k.startswith("models.")]:
            del sys.modules[key]


# ---------------------------------------------------------------------------------------------------------- settings
def variants(width: int, heads: int, halt: int) -> dict[str, dict]:
    common = [f"model.n_embd={width}", f"model.n_head={heads}", "model.expansion=4", "model.L_layers=2",
              "model.H_cycles=2", "model.L_cycles=2", f"model.halt_max_steps={halt}",
              "model.halt_exploration_prob=0.1", f"model.puzzle_emb_ndim={width}", "model.norm=post",
              "model.loss_type=stablemax"]
    return {
        "hrm": dict(repo="hrm", module="models.hrm.hrm_act_v1", cls="HierarchicalReasoningModel_ACTV1",
                    ours=["recipe=hrm-sudoku", *common, "model.H_layers=2", "model.pos_encodings=rope"], theirs={}),
        "trm-att": dict(repo="trm", module="models.recursive_reasoning.trm", cls="TinyRecursiveReasoningModel_ACTV1",
                        ours=["recipe=trm-sudoku-att", *common, "model.pos_encodings=rope"],
                        theirs=dict(mlp_t=False, puzzle_emb_len=16, no_ACT_continue=True)),
        "trm-mlp": dict(repo="trm", module="models.recursive_reasoning.trm", cls="TinyRecursiveReasoningModel_ACTV1",
                        ours=["recipe=trm-sudoku-mlp", *common, "model.pos_encodings=none", "model.mlp_t=true"],
                        theirs=dict(mlp_t=True, puzzle_emb_len=16, no_ACT_continue=True)),
    }


def their_config(arch, batch: int, dtype: str = "float32") -> dict:
    """Their model's config from our resolved arch (the same numbers), in their dataset's vocabulary."""
    return dict(batch_size=batch, seq_len=81, puzzle_emb_ndim=arch.puzzle_emb_ndim, num_puzzle_identifiers=1,
                vocab_size=11, H_cycles=arch.H_cycles, L_cycles=arch.L_cycles, H_layers=getattr(arch, "H_layers", 0),
                L_layers=arch.L_layers, hidden_size=arch.n_embd, expansion=arch.expansion,
                num_heads=arch.n_head, pos_encodings=arch.pos_encodings, halt_max_steps=arch.halt_max_steps,
                halt_exploration_prob=arch.halt_exploration_prob, forward_dtype=dtype)


# ---------------------------------------------------------------------------------------------------------- name map
def name_map(theirs: dict[str, torch.Tensor], ours: dict[str, torch.Tensor], trm: bool, extra: int):
    """[(their name, their rows, our name, our index)] for every persistent tensor of theirs, and the problems: a name
    of either side not covered, a shape that differs. Their embedding's row v + 1 is our cell value v (their 0 is PAD);
    their class c + 2 is our digit class c (their 0 and 1, PAD and blank, are never targets), and with ``extra`` (our
    model.extra_classes) 2 their classes 0 and 1 are our 9 and 10."""
    head = slice(0, 9) if extra else None
    fixed = {"inner.embed_tokens.embedding_weight": ("core.embed.weight", slice(1, None), None),
             "inner.lm_head.weight": ("core.head.weight", slice(2, None), head),
             "inner.q_head.weight": ("core.q_head.weight", None, None),
             "inner.q_head.bias": ("core.q_head.bias", None, None),
             "inner.puzzle_emb.weights": ("core.puzzle_emb.weight", None, None),
             "inner.H_init": ("core.z_init", None, 0), "inner.L_init": ("core.z_init", None, 1)}
    entries, problems, covered = [], [], set()
    for name, t in theirs.items():
        if name in fixed:
            mine, rows, index = fixed[name]
        else:
            m = re.fullmatch(r"inner\.([HL])_level\.layers\.(\d+)\.(.*)", name)
            if not m:
                problems.append(f"their {name}: no counterpart")
                continue
            rest = m.group(3)
            for pat, rep in LAYER_NAMES:
                rest = re.sub("^" + pat, rep, rest)
            level = "net" if trm else m.group(1)
            mine, rows, index = f"core.{level}.layers.{m.group(2)}.{rest}", None, None
        if mine not in ours:
            problems.append(f"their {name} -> our {mine}: we have no such tensor")
            continue
        a = t[rows] if rows is not None else t
        b = ours[mine][index] if index is not None else ours[mine]
        if a.shape != b.shape:
            problems.append(f"their {name}{'' if rows is None else f'[{rows.start}:]'} {tuple(a.shape)} vs our "
                            f"{mine}{'' if index is None else f'[{index}]'} {tuple(b.shape)}")
        entries.append((name, rows, mine, index))
        covered.add((mine, None if isinstance(index, slice) else index))
        if name == "inner.lm_head.weight" and extra:
            if extra != 2 or ours[mine].shape[0] != 11:
                problems.append(f"our {mine} {tuple(ours[mine].shape)} with model.extra_classes={extra}: their head's "
                                "PAD and blank need 2")
                continue
            entries.append((name, slice(0, 2), mine, slice(9, 11)))
    for mine, t in ours.items():
        wanted = {(mine, i) for i in range(t.shape[0])} if mine == "core.z_init" else {(mine, None)}
        for left in sorted(wanted - covered, key=str):
            problems.append(f"our {left[0]}{'' if left[1] is None else f'[{left[1]}]'}: no counterpart of theirs")
    return entries, problems


@torch.no_grad()
def copy_weights(entries, theirs: dict[str, torch.Tensor], ours: dict[str, torch.Tensor]) -> None:
    for name, rows, mine, index in entries:
        src = theirs[name][rows] if rows is not None else theirs[name]
        (ours[mine][index] if index is not None else ours[mine]).copy_(src)


# ------------------------------------------------------------------------------------------------------------ one run
class Theirs:
    """Their model, loss head and optimizers as their pretrain.py makes them (AdamATan2 -> AdamW), on the CPU;
    ``perturb``: every parameter times (1 + perturb x N(0, 1)) after the init (the noise floor's second copy);
    ``classes="matched"``: their PAD and blank logits held at -1e12."""

    def __init__(self, mods, v: dict, tcfg: dict, arch, t, classes: str, seed: int, perturb: float = 0.0):
        net, losses, self.sparse = (mods[v["repo"]][k] for k in (v["module"], "models.losses",
                                                                    "models.sparse_embedding"))
        torch.manual_seed(seed)
        self.model = getattr(net, v["cls"])(tcfg)
        if tcfg["forward_dtype"] == "float64":
            self.model.double()  # their weights and buffers (the puzzle embedding's too) made float64 after the init
            for m in self.model.modules():  # a buffer that takes gradients (the embedding's batch rows): a leaf again
                for k, buf in list(m.named_buffers(recurse=False)):
                    if buf.requires_grad and not buf.is_leaf:
                        setattr(m, k, buf.detach().requires_grad_())  # still a buffer: nn.Module's own assignment
        if perturb:
            g = torch.Generator().manual_seed(seed + 1)
            with torch.no_grad():
                for q in self.model.parameters():
                    q.mul_(1 + perturb * torch.randn(q.shape, generator=g, dtype=q.dtype))
        if classes == "matched":
            self.model.inner.lm_head.register_forward_hook(
                lambda m, i, out: out.index_fill(-1, torch.tensor([0, 1]), -1e12))
        self.head = losses.ACTLossHead(self.model, loss_type=f"{arch.loss_type}_cross_entropy")
        self.opts = [self.sparse.CastedSparseEmbeddingSignSGD_Distributed(
            self.model.inner.puzzle_emb.buffers(), lr=0, weight_decay=t.puzzle_emb_weight_decay, world_size=1),
            torch.optim.AdamW(self.head.parameters(), lr=0, weight_decay=t.weight_decay, betas=(t.beta1, t.beta2))]
        self.base_lrs, self.t, self.carry = [t.puzzle_emb_lr, t.lr], t, None
        self.head.train()

    def step(self, batch: dict, step: int, seed: int):
        """pretrain.py's train_batch: (loss per row, metrics per row, logits, lr)."""
        torch.manual_seed(seed)
        if self.carry is None:
            self.carry = self.head.initial_carry(batch)
        self.carry, loss, metrics, out, _ = self.head(return_keys=["logits"], carry=self.carry, batch=batch)
        B = batch["inputs"].shape[0]
        ((1 / B) * loss).backward()
        lrs = [their_lr(base, step, self.t) for base in self.base_lrs]
        for opt, lr in zip(self.opts, lrs):
            for g in opt.param_groups:
                g["lr"] = lr
            opt.step()
            opt.zero_grad()
        return float(loss.detach()) / B, {k: float(v) / B for k, v in metrics.items()}, out["logits"], lrs[1]


def settings(v: dict, args, classes: str):
    extra = [] if classes == "published" else ["model.extra_classes=0"]  # published: the recipe's
    cfg = config.parse(v["ours"] + extra + ["training.optimizer=adamw", f"training.lr={args.lr}",
                                    f"training.puzzle_emb_lr={args.lr}", "training.weight_decay=1.0",
                                    "training.puzzle_emb_weight_decay=1.0", "training.warmup_steps=0",
                                    f"training.max_steps={args.steps}", "training.grad_clip=0"])
    arch = config.resolved_model(cfg.model)
    return cfg, cfg.training, arch, dict(their_config(arch, args.batch, args.dtype), **v["theirs"])


def run_variant(name: str, v: dict, mods: dict, args, puzzles: Puzzles, classes: str) -> dict:
    cfg, t, arch, tcfg = settings(v, args, classes)
    theirs = Theirs(mods, v, tcfg, arch, t, classes, args.seed)
    ours = models.build(cfg.task, arch)
    if args.dtype == "float64":
        ours.double()
    their_sd, our_sd = theirs.model.state_dict(), ours.state_dict()
    entries, problems = name_map(their_sd, our_sd, trm=v["repo"] == "trm", extra=arch.extra_classes)
    inner = theirs.model.inner
    res = {"variant": name, "classes": classes, "our_settings": v["ours"], "their_config": tcfg,
           "parameters": {"theirs": sum(p.numel() for p in theirs.model.parameters())
                          + inner.puzzle_emb.weights.numel(),
                          "ours": sum(p.numel() for p in ours.parameters()),
                          "theirs_without_counterpart": inner.embed_tokens.embedding_weight[:1].numel()
                          + (0 if arch.extra_classes else inner.lm_head.weight[:2].numel())},
           "name_map": {"tensors": len(entries), "problems": problems}}
    p = res["parameters"]
    p["equal_but_for_their_extra_rows"] = p["theirs"] - p["theirs_without_counterpart"] == p["ours"]
    if problems:
        res["ok"] = False
        return res
    copy_weights(entries, their_sd, our_sd)
    checks = res["checks"] = {}
    if hasattr(inner, "rotary_emb"):
        cos, sin = ours.core.rotary(torch.device("cpu"))
        checks["rotary_tables_equal"] = bool(torch.equal(cos, inner.rotary_emb.cos_cached)
                                             and torch.equal(sin, inner.rotary_emb.sin_cached))
    res.update(train(theirs, ours, cfg, t, args, puzzles))
    if args.floor and (classes == "matched" or args.classes == "published"):
        res["noise_floor"] = floor(mods, v, tcfg, arch, t, classes, args, puzzles)
    res["ok"] = all(checks.values()) and res["max_rel_loss_diff"] <= TOLERANCE
    return res


def batches(puzzles: Puzzles, args):
    """The same batches in the same order for every side: (step, our x, our y, their batch)."""
    task, B = tasks.get("sudoku"), args.batch
    rng = np.random.default_rng(args.seed)
    order: list[int] = []
    for step in range(1, args.steps + 1):
        while len(order) < B:
            order.extend(rng.permutation(len(puzzles)).tolist())
        idx, order = order[:B], order[B:]
        x, y = puzzles.batch(idx)
        yield step, x, y, {"inputs": (x + 1).to(torch.int32), "labels": task.targets(x, y) + 2,
                           "puzzle_identifiers": torch.zeros(B, dtype=torch.int32)}


def train(theirs: Theirs, ours, cfg, t, args, puzzles: Puzzles) -> dict:
    """Their train_batch and our trainer's step, side by side, on the same batches; the losses and halting per step."""
    our_opt = optim.make_optimizer(ours, t, torch.device("cpu"))
    theirs_as_ours = torch.tensor([*range(2, 11), 0, 1]) if ours.core.head.weight.shape[0] == 11 else \
        torch.arange(2, 11)  # their logits in our classes' order
    loss_of = objective.make(ours, cfg)
    ours.train()
    rows, first_logits, B = [], None, args.batch
    for step, x, y, batch in batches(puzzles, args):
        seed = args.seed * 100003 + step  # the exploration's draws, the same on both sides
        loss, metrics, logits_t, lr_theirs = theirs.step(batch, step, seed)
        if first_logits is None:  # the first forward, before any update: the same weights, the same inputs
            with torch.no_grad():
                _, logits, _ = ours.core(tuple(ours.core.initial_states(B, 81)), x)
                first_logits = float((logits - logits_t[..., theirs_as_ours]).abs().max())
        torch.manual_seed(seed)
        our_loss, m = loss_of.loss(ours, x, y, 0)
        our_loss.backward()
        lr_ours = optim.lr_at(t, step)
        optim.set_lr(our_opt, lr_ours)
        our_opt.step()
        our_opt.zero_grad(set_to_none=True)
        carry, our_carry = theirs.carry, loss_of.carries[0]
        rows.append({"step": step, "theirs": loss, "ours": float(our_loss.detach()),
                     "lm": [metrics["lm_loss"], float(m["lm_loss"])],
                     "q_halt": [metrics["q_halt_loss"], float(m["q_halt_loss"])],
                     "q_continue": [metrics.get("q_continue_loss", 0.0), float(m["q_continue_loss"])],
                     "halted": [int(carry.halted.sum()), int(our_carry.halted.sum())],
                     "halting_equal": bool(torch.equal(carry.halted, our_carry.halted)),
                     "steps_equal": bool(torch.equal(carry.steps.long(), our_carry.steps)),
                     "lr_equal": lr_theirs == lr_ours})
    rel = [abs(r["ours"] - r["theirs"]) / abs(r["theirs"]) for r in rows]
    worst = max(range(len(rel)), key=rel.__getitem__)
    return {"first_forward_max_logit_diff": first_logits, "max_rel_loss_diff": rel[worst], "at_step": worst + 1,
            "halting_equal_steps": sum(r["halting_equal"] and r["steps_equal"] for r in rows), "steps": len(rows),
            "halted_rows": [sum(r["halted"][0] for r in rows), sum(r["halted"][1] for r in rows)],
            "lr_equal": all(r["lr_equal"] for r in rows), "per_step": rows}


def floor(mods, v, tcfg, arch, t, classes, args, puzzles) -> dict:
    """Their code against itself, the second copy's initial weights perturbed by 1 part in 10^7 (10^15 in float64): how
    far rounding alone carries the losses apart over the same steps (the comparison cannot be closer than this)."""
    a, b = (Theirs(mods, v, tcfg, arch, t, classes, args.seed, perturb=e) for e in (0.0, PERTURB[args.dtype]))
    rel, halting = [], 0
    for step, _, _, batch in batches(puzzles, args):
        seed = args.seed * 100003 + step
        la, lb = a.step(batch, step, seed)[0], b.step(batch, step, seed)[0]
        rel.append(abs(lb - la) / abs(la))
        halting += bool(torch.equal(a.carry.halted, b.carry.halted))
    return {"perturbation": PERTURB[args.dtype], "max_rel_loss_diff": max(rel), "at_step": rel.index(max(rel)) + 1,
            "halting_equal_steps": halting}


def their_lr(base: float, step: int, t) -> float:
    """Their pretrain.py's schedule (compute_lr: warm-up, then a cosine to lr_min_ratio; the step counted from 1)."""
    if step < t.warmup_steps:
        return base * step / max(1, t.warmup_steps)
    progress = (step - t.warmup_steps) / max(1, t.max_steps - t.warmup_steps)
    return base * (t.min_lr_ratio + max(0.0, (1 - t.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))))


# ------------------------------------------------------------------------------------------------------------ output
def say(res: dict) -> None:
    p = res["parameters"]
    mode = "their 11 classes as published, ours with the recipe's model.extra_classes=2" \
        if res["classes"] == "published" else "classes matched: their PAD and blank logits held out, ours 9"
    print(f"\n== {res['variant']} ({mode})")
    print(f"   ours: {' '.join(res['our_settings'])}")
    print(f"   parameters: theirs {p['theirs']:,} (puzzle embedding included), ours {p['ours']:,}; theirs without "
          f"counterpart {p['theirs_without_counterpart']:,} (embedding row PAD"
          f"{', head rows PAD and blank' if res['classes'] == 'matched' else ''}): "
          f"{'equal but for those' if p['equal_but_for_their_extra_rows'] else 'NOT equal'}")
    nm = res["name_map"]
    print(f"   name map: {nm['tensors']} tensors, "
          + ("every tensor of both covered, shapes equal" if not nm["problems"] else "PROBLEMS:"))
    for line in nm["problems"]:
        print(f"     {line}")
    if "per_step" not in res:
        print("   not trained: the name map failed")
        return
    for k, ok in res["checks"].items():
        print(f"   {k}: {ok}")
    print("   first forward, same weights and inputs: max |logit difference| "
          f"{res['first_forward_max_logit_diff']:.2e}")
    print(f"   {'step':>5} {'theirs':>9} {'ours':>9} {'rel':>9}  halted (theirs, ours)")
    for r in res["per_step"]:
        if r["step"] in (1, 2, 5, 10) or r["step"] % 20 == 0:
            rel = abs(r["ours"] - r["theirs"]) / abs(r["theirs"])
            print(f"   {r['step']:>5} {r['theirs']:9.5f} {r['ours']:9.5f} {rel:9.2e}  "
                  f"{r['halted'][0]:>3} {r['halted'][1]:>3}"
                  f"{'' if r['halting_equal'] else '  halting differs'}")
    print(f"   max relative loss difference over {res['steps']} steps: {res['max_rel_loss_diff']:.2e} (step "
          f"{res['at_step']}; target <= {TOLERANCE:.0%}); halting decisions equal at {res['halting_equal_steps']}/"
          f"{res['steps']} steps (rows halted: theirs {res['halted_rows'][0]}, ours {res['halted_rows'][1]}); "
          f"lr equal: {res['lr_equal']} -> {'ok' if res['ok'] else 'FAIL'}")
    if "noise_floor" in res:
        f = res["noise_floor"]
        print(f"   noise floor: their code against itself, initial weights x (1 + {f['perturbation']:g} N(0,1)): max "
              f"relative loss difference {f['max_rel_loss_diff']:.2e} (step {f['at_step']}); halting equal at "
              f"{f['halting_equal_steps']}/{res['steps']} steps")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hrm", type=Path, help="a checkout of github.com/sapientinc/HRM")
    ap.add_argument("--trm", type=Path, help="a checkout of github.com/SamsungSAILMontreal/TinyRecursiveModels")
    ap.add_argument("--family", choices=("hrm", "trm", "trm-att", "trm-mlp", "both"), default="both")
    ap.add_argument("--classes", choices=("published", "matched", "both"), default="both")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--width", type=int, default=96)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--halt-max-steps", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-4, help="both sides, constant (the recipes' rate after warm-up)")
    ap.add_argument("--puzzles", type=int, default=512, help="generated medium puzzles (30-36 givens)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                    help="both sides' weights, states and activations (float64: a diagnostic of float32 rounding)")
    ap.add_argument("--no-floor", dest="floor", action="store_false",
                    help="skip the noise floor (their code against itself, weights perturbed by 1e-7, 1e-15 in "
                         "float64)")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout (the per-step figures too)")
    ap.add_argument("--out", type=Path, help="also write that JSON object to this file")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    wanted = {"hrm": ["hrm"], "trm": ["trm-att", "trm-mlp"], "trm-att": ["trm-att"], "trm-mlp": ["trm-mlp"],
              "both": ["hrm", "trm-att", "trm-mlp"]}[args.family]
    for repo in {v.split("-")[0] for v in wanted}:
        if getattr(args, repo) is None:
            ap.error(f"--{repo} DIR is needed for --family {args.family}")
    mods = {}
    if "hrm" in wanted:
        mods["hrm"] = import_theirs(args.hrm, ["models.hrm.hrm_act_v1", "models.losses", "models.sparse_embedding"],
                                    args.dtype == "float64")
    if any(v.startswith("trm") for v in wanted):
        mods["trm"] = import_theirs(args.trm, ["models.recursive_reasoning.trm", "models.losses",
                                               "models.sparse_embedding"], args.dtype == "float64")
    p, s = sudoku.generate(args.puzzles, args.seed, *sudoku.DIFFICULTIES["medium"])
    puzzles = Puzzles.of(np.array([[a, b] for a, b in zip(p, s)], np.uint8))
    table = variants(args.width, args.heads, args.halt_max_steps)
    modes = ["published", "matched"] if args.classes == "both" else [args.classes]
    results, began = [], time.perf_counter()
    shims = SHIMS if args.dtype == "float32" else [
        "forward_dtype=float64 in their config, their weights made float64 after the init; their model code read "
        "with every torch.float32 as torch.float64 (in memory, their files untouched)" if "forward_dtype" in line
        else line for line in SHIMS]
    if not args.json:
        print(f"reference check: {args.steps} steps, batch {args.batch}, {args.puzzles} generated medium puzzles, "
              f"lr {args.lr:g} constant, {args.dtype}, torch {torch.__version__}, {args.threads} thread(s)")
        print("what had to change in theirs to run on a CPU:")
        for line in shims:
            print(f"  - {line}")
    for name in wanted:
        for mode in modes:
            res = run_variant(name, table[name], mods, args, puzzles, mode)
            results.append(res)
            if not args.json:
                say(res)
    ok = all(r["ok"] for r in results)
    doc = json.dumps({"ok": ok, "shims": shims, "steps": args.steps, "batch": args.batch, "lr": args.lr,
                      "dtype": args.dtype,
                      "torch": torch.__version__,
                      "seconds": round(time.perf_counter() - began, 1), "results": results})
    if args.out:
        args.out.write_text(doc + "\n")
    if args.json:
        print(doc)
    else:
        print(f"\n{'all checks passed' if ok else 'FAILED'}: "
              + ", ".join(f"{r['variant']}/{r['classes']} {'ok' if r['ok'] else 'FAIL'}" for r in results)
              + f" ({time.perf_counter() - began:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
