"""Each model family's args (auralm.models.args): a typed dataclass per family, every value checked against its
field's type wherever args are made, one type a key across families, and what a checkpoint saves read back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest

from auralm.errors import UserError
from auralm.models import registry
from auralm.models.args import Literal, ModelArgs, field_types
from auralm.models.hrm.spec import HRMArgs
from auralm.models.registry import ModelFamily
from auralm.models.rlm.spec import RLMArgs
from auralm.models.trm.spec import TRMArgs
from auralm.training import command_line, config


def test_each_family_reads_its_own_fields_and_the_shape_every_family_has():
    shared = set(field_types(ModelArgs))
    assert shared == {"n_embd", "n_head", "block_size", "dropout"}
    assert {"H_layers"} == set(field_types(HRMArgs)) - set(field_types(TRMArgs))
    assert {"mlp_t"} == set(field_types(TRMArgs)) - set(field_types(HRMArgs))
    assert {"head_dim", "ffn_dim", "mhc_flows", "n_layer"} <= set(field_types(RLMArgs))
    for fam in registry.families():  # every size is its family's args, and says its family
        for size in fam.sizes.values():
            assert type(size) is fam.args and size.family == ("" if fam.plain else fam.name)


@pytest.mark.parametrize("change, message", [
    (dict(H_cycles=2.5), "model.H_cycles=2.5: expected an integer"),
    (dict(H_cycles=True), "model.H_cycles=True: expected an integer"),
    (dict(expansion="wide"), "model.expansion='wide': expected a number"),
    (dict(pos_encodings="alibi"), "model.pos_encodings='alibi': expected one of auto, rope, learned, sudoku, none"),
    (dict(norm=None), "model.norm=None: expected one of post, pre"),
    (dict(mlp_t=True), "model.mlp_t is not a key of HRMArgs"),
])
def test_a_value_of_the_wrong_type_is_refused_wherever_args_are_made(change, message):
    with pytest.raises(UserError) as e:
        config.SIZES["hrm-tiny"].replace(**change)
    assert message in str(e.value)


def test_a_number_field_takes_an_integer_and_an_optional_field_none():
    hrm = config.SIZES["hrm-tiny"].replace(expansion=2, halt_exploration_prob=0)
    assert (hrm.expansion, hrm.halt_exploration_prob) == (2.0, 0.0) and isinstance(hrm.expansion, float)
    rlm = config.SIZES["rlm-tiny"].replace(vocab_size=None)
    assert rlm.vocab_size is None and rlm.replace(vocab_size=512).vocab_size == 512


def test_the_command_line_parses_a_key_by_its_fields_type_and_leaves_the_size_unchanged():
    cfg = command_line.parse(["model=trm-tiny", "model.expansion=2", "model.mlp_t=true", "model.norm=post"])
    arch = config.resolved_model(cfg.model)
    assert (arch.expansion, arch.mlp_t, arch.norm) == (2.0, True, "post")
    assert (config.SIZES["trm-tiny"].mlp_t, config.SIZES["trm-tiny"].norm) == (False, "pre")  # frozen: a new one
    with pytest.raises(UserError, match=r"model.mlp_t='maybe': expected true or false"):
        command_line.parse(["model=trm-tiny", "model.mlp_t=maybe"])


def test_what_a_checkpoint_saves_is_read_back_on_top_of_its_size():
    arch = config.SIZES["trm-7m"].replace(L_cycles=4, mlp_t=True)
    saved = {"name": "trm-7m", **arch.to_dict()}
    assert saved["family"] == "trm" and registry.args_from_saved("sudoku", saved) == arch
    older = {k: v for k, v in saved.items() if k not in ("extra_classes", "puzzle_emb_len")}  # before those keys
    older["H_layers"] = 0  # and a key this family no longer reads
    assert registry.args_from_saved("sudoku", older) == arch
    plain = {"name": "tiny", **config.SIZES["tiny"].replace(n_layer=3).to_dict()}  # a plain size: no family
    assert "family" not in plain and registry.args_from_saved("lm", plain).n_layer == 3
    assert registry.of("sudoku", registry.args_from_saved("sudoku", plain)).name == "transformer"


def test_a_family_registers_only_typed_args_of_its_own_and_a_key_keeps_one_type():
    @dataclass(frozen=True, kw_only=True)
    class Wide(ModelArgs):
        family: ClassVar[str] = "wide"
        n_layer: float = 1.0  # n_layer is an integer in every other family

    def family(args, sizes, name="wide"):
        return ModelFamily(name=name, title="Wide", args=args, sizes=sizes, build=None, model_class=None,
                           tasks=("sudoku",))

    with pytest.raises(ValueError, match="one key, one type"):
        registry.register(family(Wide, {"wide-tiny": Wide(n_embd=8, n_head=1, block_size=81)}))
    with pytest.raises(ValueError, match="args must be a dataclass subclassing"):
        family(dict, {})
    with pytest.raises(ValueError, match="must say family = 'other'"):
        family(Wide, {}, name="other")

    @dataclass(frozen=True, kw_only=True)
    class Kind(ModelArgs):
        family: ClassVar[str] = "kind"
        kind: Literal["a", "b"] = "a"

    with pytest.raises(ValueError, match="size 'kind-tiny' must be a Kind"):
        registry.register(family(Kind, {"kind-tiny": config.SIZES["tiny"]}, name="kind"))
    assert "wide" not in registry.names() and "kind" not in registry.names() and "kind" not in registry.KEYS
