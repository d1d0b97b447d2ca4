"""mHC and the RLM family: Sinkhorn's projection, the plain-residual start, the amax metrics, the config keys."""

from __future__ import annotations

import pytest
import torch

from auralm import models
from auralm.training import command_line, config
from auralm.errors import UserError
from auralm.models import mhc

VOCAB = 97


def rlm(*overrides: str, vocab: int = VOCAB, seed: int = 0) -> models.RLMModel:
    cfg = command_line.parse(["task=lm", "model=rlm-tiny", "model.hidden_dim=64", "model.num_heads=2",
                        "model.head_dim=32", "model.ffn_dim=128", "model.num_layers=3", *overrides])
    torch.manual_seed(seed)
    return models.build("lm", config.resolved_model(cfg.model), vocab)


def tokens(b: int = 2, t: int = 24, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


def _doubly_stochastic(m: torch.Tensor, tol: float) -> bool:
    return bool((m >= 0).all() and (m.sum(-1) - 1).abs().max() < tol and (m.sum(-2) - 1).abs().max() < tol)


@pytest.mark.parametrize("spread", [0.1, 1.0])
def test_sinkhorn_projects_onto_doubly_stochastic_matrices(spread):
    logits = torch.randn(4, 4, 500, generator=torch.Generator().manual_seed(0)) * spread
    m = mhc.sinkhorn(logits, 20)
    assert _doubly_stochastic(m.permute(2, 0, 1), 1e-3)
    # a matrix that is doubly stochastic already (here a permutation, softly) stays where it is
    perm = torch.eye(4)[[2, 0, 3, 1]]
    assert torch.allclose(mhc.sinkhorn((perm * 30)[:, :, None], 20)[:, :, 0], perm, atol=1e-6)


def test_sinkhorn_on_peaked_logits_ends_with_exact_columns_and_rows_that_more_rounds_bring_closer():
    logits = torch.randn(4, 4, 500, generator=torch.Generator().manual_seed(0)) * 3  # ratios up to e^12
    row_error = {}
    for iters in (20, 200):
        m = mhc.sinkhorn(logits, iters)
        assert (m.sum(0) - 1).abs().max() < 1e-5  # the last step normalises the columns
        row_error[iters] = float((m.sum(1) - 1).abs().max())
    assert row_error[200] < row_error[20] / 3  # which is what mhc/amax_pre shows when it is above 1


def _unrolled_sinkhorn(logits: torch.Tensor, iters: int) -> torch.Tensor:
    m = (logits - logits.amax(dim=(0, 1), keepdim=True)).exp()
    for _ in range(iters):
        m = m / m.sum(1, keepdim=True)
        m = m / m.sum(0, keepdim=True)
    return m


@pytest.mark.parametrize("spread", [0.5, 4.0])
def test_sinkhorns_hand_written_backward_is_autograds_through_every_round(spread):
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(4, 4, 64, generator=gen, dtype=torch.float64) * spread).requires_grad_()
    weights = torch.randn(4, 4, 64, generator=gen, dtype=torch.float64)
    want, = torch.autograd.grad((_unrolled_sinkhorn(logits, 20) * weights).sum(), logits)
    loss = (mhc._Sinkhorn.apply(logits, 20) * weights).sum()
    got, = torch.autograd.grad(loss, logits, retain_graph=True)
    assert torch.allclose(got, want, rtol=1e-9, atol=1e-12)
    again, = torch.autograd.grad(loss, logits)  # the backward pass leaves what it saved as it was
    assert torch.equal(again, got)
    # and in float32, as the model calls it: to float32's precision
    small = logits.detach().float().requires_grad_()
    got32, = torch.autograd.grad((mhc.sinkhorn(small, 20) * weights.float()).sum(), small)
    assert (got32.double() - want).abs().max() < 1e-5


def test_the_connections_hand_written_products_have_the_gradients_of_their_definitions():
    gen = torch.Generator().manual_seed(4)
    t, n, d = 5, 4, 6

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64, requires_grad=True)

    for fn, args in ((mhc._RMSScale, (rand(t, n * d),)), (mhc._Read, (rand(t, n), rand(t, n, d))),
                     (mhc._Write, (rand(t, n, n), rand(t, n, d), rand(t, n), rand(t, d)))):
        assert torch.autograd.gradcheck(fn.apply, args, rtol=1e-6, atol=1e-8), fn.__name__


def test_one_stream_with_the_gates_at_zero_is_exactly_the_plain_model():
    plain, wide = rlm("model.mhc_enabled=false").eval(), rlm("model.mhc_flows=1", seed=5).eval()
    result = wide.load_state_dict(plain.state_dict(), strict=False)
    assert not result.unexpected_keys and all("_hc." in k for k in result.missing_keys)
    with torch.no_grad():
        for hc in wide.connections():
            hc.gate.zero_()
    x = tokens()
    assert torch.equal(plain(x)[0], wide(x)[0])
    with torch.no_grad():
        wide.connections()[0].gate.fill_(0.5)  # ... and the gates do take part
    assert not torch.equal(plain(x)[0], wide(x)[0])


def test_four_streams_at_initialisation_are_close_to_the_plain_residual():
    plain, wide = rlm("model.mhc_enabled=false").eval(), rlm(seed=5).eval()
    wide.load_state_dict(plain.state_dict(), strict=False)
    x = tokens()
    with torch.no_grad():
        p, w = plain(x)[0], wide(x)[0]
        rel = float((p - w).norm() / p.norm())
        assert 0 < rel < 1e-2  # only the small gated input-dependent parts differ (2e-3 measured)
        for hc in wide.connections():
            hc.gate.zero_()
        assert float((plain(x)[0] - wide(x)[0]).norm() / p.norm()) < 1e-5  # equal streams, H_pre = 1/n, H_post = 1


@pytest.mark.slow  # a real training run (10-20 s of CPU): not in scripts/test.sh --fast
def test_connection_matrices_stay_doubly_stochastic_through_training_and_amax_is_reported():
    model = rlm()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = tokens(4, 32)
    first = None
    for _ in range(30):
        _, loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        first = first or float(loss.detach())
    assert float(loss.detach()) < first  # it learns
    gates = torch.stack([hc.gate.detach() for hc in model.connections()])
    assert not torch.allclose(gates, torch.full_like(gates, mhc.GATE_INIT))  # the gates are trained
    for hc in model.connections():
        assert _doubly_stochastic(hc.get_connection_matrix(), 1e-3)
    per_layer = model.get_mhc_metrics()
    assert len(per_layer) == 3
    assert all(1 - 1e-6 <= a < 2.0 and 1 - 1e-6 <= b < 2.0 for a, b in per_layer)
    assert not rlm("model.mhc_enabled=false").connections() and rlm("model.mhc_enabled=false").get_mhc_metrics() == []


def test_amax_is_the_largest_row_and_column_sum_of_the_composite_mixing():
    a, b = mhc.HyperConnection(8, 2, 20), mhc.HyperConnection(8, 2, 20)
    a.last_res = torch.tensor([[[1.0, 0.5], [0.0, 0.5]]])  # rows 1.5, 0.5; columns 1, 1
    b.last_res = torch.tensor([[[2.0, 0.0], [0.0, 1.0]]])
    (pre_a, post_a), (pre_b, post_b) = mhc.amax([a, b])
    assert (pre_a, post_a) == (1.5, 1.0)
    # b @ a = [[2, 1], [0, 0.5]]: rows 3, 0.5; columns 2, 1.5
    assert (pre_b, post_b) == (3.0, 2.0)


def test_gradients_reach_every_part_of_the_connections():
    model = rlm()
    _, loss = model(tokens()[:, :-1], tokens()[:, 1:])
    loss.backward()
    for hc in model.connections():
        for name, p in hc.named_parameters():
            assert p.grad is not None and float(p.grad.abs().sum()) > 0, name


def test_the_guide_keys_set_the_rlm_shape_and_wrong_uses_are_one_clear_error():
    cfg = command_line.parse(["task=lm", "model=rlm-tiny", "model.hidden_dim=96", "model.num_layers=2", "model.num_heads=3",
                        "model.max_seq_len=64", "model.gradient_checkpointing=true", "model.mhc_flows=2",
                        "model.mhc_sinkhorn_iters=5", "model.mhc_enabled=true"])
    arch = config.resolved_model(cfg.model)
    assert (arch.n_embd, arch.n_layer, arch.n_head, arch.block_size) == (96, 2, 3, 64)
    assert (arch.mhc_flows, arch.mhc_sinkhorn_iters, cfg.training.grad_checkpoint) == (2, 5, True)
    for bad, words in [(["task=lm", "model=tiny", "model.mhc_flows=4"], "rlm-"),
                       (["task=sudoku", "model=rlm-tiny"], "task=lm"),
                       (["task=lm", "model=rlm-tiny", "model.head_dim=33"], "even"),
                       (["task=lm", "model=rlm-tiny", "model.mhc_flows=0"], "greater than 0")]:
        with pytest.raises(UserError, match=words):
            command_line.parse(bad)
    with pytest.raises(ValueError, match="smaller than the data"):
        rlm("model.vocab_size=50")


def test_named_sizes_count_what_the_guide_says():
    from auralm.planning import sizing

    counts = {m: sizing.count_parameters("lm", config.resolved_model(command_line.parse(["task=lm", f"model={m}"]).model),
                                         32000) for m in ("rlm-small", "rlm-base", "rlm-large")}
    assert 110e6 < counts["rlm-small"] < 150e6
    assert 1.2e9 < counts["rlm-base"] < 1.5e9
    assert 6.3e9 < counts["rlm-large"] < 7.3e9


def test_gradient_checkpointing_gives_the_same_gradients():
    x = tokens()
    grads = []
    for on in (False, True):
        model = rlm()
        model.set_grad_checkpointing(on)
        _, loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


@pytest.mark.slow  # a real training run (10-20 s of CPU): not in scripts/test.sh --fast
def test_training_logs_amax_every_record_and_the_plain_model_none(tmp_path, quijote_data):
    from auralm.training import train
    from tests.trainer.helpers import records

    text = quijote_data(512, 20000)
    common = ["task=lm", f"data_dir={text}", "model=rlm-tiny", "model.hidden_dim=64", "model.num_heads=2",
              "model.head_dim=32", "model.ffn_dim=128", "model.num_layers=2", "model.max_seq_len=32",
              "training.batch_size=4", "training.max_steps=6", "training.log_interval=2", "training.eval_interval=0",
              "training.checkpoint_interval=0", "training.sample_tokens=0"]
    assert train.main([*common, f"out_dir={tmp_path / 'mhc'}"]) == 0
    rows = records(tmp_path / "mhc")
    assert [r["step"] for r in rows] == [2, 4, 6]
    assert all(1 - 1e-6 <= r["mhc/amax_pre"] < 2 and 1 - 1e-6 <= r["mhc/amax_post"] < 2 for r in rows)
    assert train.main([*common, "model.mhc_enabled=false", f"out_dir={tmp_path / 'plain'}"]) == 0
    assert not any("mhc/amax_pre" in r for r in records(tmp_path / "plain"))


def test_validate_model_says_what_is_wrong_in_one_line(capsys):
    """Bad keys and a model that is not a language model: one line, exit 2, before any model is built. (A
    healthy model passing every check: test_validate_model_passes_at_its_default_and_the_guides_size.)"""
    from cli.app import main

    small = ["model.hidden_dim=64", "model.num_heads=2", "model.head_dim=32", "model.ffn_dim=128",
             "model.num_layers=2", "model.max_seq_len=32"]
    assert main(["validate-model", *small, "model.num_layers=0"]) == 2  # bad keys: one line, exit 2
    err = capsys.readouterr().err
    assert "model.n_layer=0" in err and err.startswith("error: ") and err.count("\n") == 1
    assert main(["validate-model", "task=sudoku", "model=tiny"]) == 2
    assert "language models" in capsys.readouterr().err
    assert main(["validate-model", "--nope"]) == 2
    assert capsys.readouterr().err == "error: No such option: --nope (see `hrmctl validate-model --help`)\n"


def test_after_training_the_check_holds_what_sinkhorn_guarantees_and_reports_the_rows():
    """issue 33, item 6: after validate-model's overfit the H_res logits of a token spread over 30-35 nats, where
    Sinkhorn's rows at 20 rounds are up to 0.2 off (the columns exact, its last step); the old check held rows to
    1e-3 and failed every healthy model. The columns are held to float precision, a matrix that is not Sinkhorn's
    (columns off) still fails."""
    from auralm.models.rlm import spec as rlm_spec  # the RLM family's validate-model checks

    torch.manual_seed(0)
    hc = mhc.HyperConnection(d=16, n=4, sinkhorn_iters=20)
    with torch.no_grad():
        hc.gate.fill_(8.0)  # peaked per-token logits, as training leaves them
    hc(torch.randn(64, 4, 16), lambda h: h)
    rows = float((hc.last_res.sum(-1) - 1).abs().max())
    assert rows > rlm_spec.TOLERANCE  # the case the old check refused
    ok = rlm_spec.trained_stochastic([hc])
    assert ok["ok"] and "rows within" in ok["detail"] and "model.mhc_sinkhorn_iters" in ok["detail"], ok
    hc.last_res = hc.last_res * 1.01  # columns no longer sum to 1: not a Sinkhorn result
    assert not rlm_spec.trained_stochastic([hc])["ok"]


@pytest.mark.slow
def test_validate_model_passes_at_its_default_and_the_guides_size(capsys, one_thread):
    """A healthy model passes every check, the RLM's own before and after the overfit among them (one --json run;
    it also covers what a separate run of a smaller model proved before). The RLM guide's quick-start size
    (model.hidden_dim=256 model.num_layers=4 model.num_heads=4) is validate-model's default, rlm-tiny, resolved to the
    same architecture: one run covers both (a second run of it, until 2026-11-29, gave the same losses to the bit)."""
    import json

    from auralm.tools import validate_model
    from cli.app import main

    guide = validate_model.DEFAULTS + ["model.hidden_dim=256", "model.num_layers=4", "model.num_heads=4"]
    assert config.resolved_model(command_line.parse(guide).model) == \
        config.resolved_model(command_line.parse(validate_model.DEFAULTS).model)
    assert main(["validate-model", "--json"]) == 0, capsys.readouterr().out
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and all(c["ok"] for c in report["checks"]), report
    assert {c["check"] for c in report["checks"]} >= {
        "parameters", "forward", "backward", "doubly stochastic", "amax", "overfit one batch",
        "doubly stochastic after training", "amax after training"}, report


def test_a_guide_command_line_without_a_size_is_an_rlm_on_text():
    cfg = command_line.parse(["model.hidden_dim=128", "model.num_layers=2", "model.mhc_enabled=true", "model.mhc_flows=4",
                        "model.mhc_sinkhorn_iters=20", "training.optimizer.lr=3e-4"])
    assert (cfg.task, cfg.model.name, config.resolved_model(cfg.model).n_embd) == ("lm", "rlm-tiny", 128)
    assert command_line.parse(["task=lm", "model=rlm-small", "model.mhc_flows=2"]).model.name == "rlm-small"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_collapse_is_the_streams_mean_in_float32_with_autograds_gradient(dtype):
    x = torch.randn(2, 5, 4, 8).to(dtype).requires_grad_()
    grad = torch.randn(2, 5, 8)
    out = mhc.collapse(x)
    out.backward(grad)
    ref = x.detach().clone().requires_grad_()
    want = ref.mean(-2, dtype=torch.float32)
    want.backward(grad)
    assert out.dtype == torch.float32 and torch.equal(out, want)
    assert x.grad.dtype == dtype and x.grad.is_contiguous() and torch.equal(x.grad, ref.grad)


def test_the_models_own_figures_reach_the_log_line_and_an_amax_above_the_bound_is_a_warning_event(monkeypatch):
    """step_figures: the RLM family's figures for the trainer's log line; the trainer logs what it is given (its
    warning as an event with the figures) and nothing for a model without figures."""
    from auralm.models.rlm import model as rlm_model
    from auralm.training.train import model_figures

    events = []
    log = type("Log", (), {"event": lambda self, step, kind, message, **f: events.append((step, kind, message, f))})()
    m = rlm()
    m(tokens())
    metrics, text, warning = m.step_figures(7)
    assert set(metrics) == {"mhc/amax_pre", "mhc/amax_post"} and text.startswith(" | amax ") and warning is None
    monkeypatch.setattr(m, "get_mhc_metrics", lambda: [(1.2, 1.0), (rlm_model.AMAX_WARN + 0.5, 1.1)])
    assert model_figures(m, log, 7) == ({"mhc/amax_pre": 2.5, "mhc/amax_post": 1.1}, " | amax 2.500/1.100")
    [(step, kind, message, fields)] = events
    assert (step, kind, fields) == (7, "mhc_amax", {"pre": 2.5, "post": 1.1})
    assert message.startswith("warning: mHC amax at step 7: pre 2.50, post 1.10 (above 2.0")
    assert "lower training.lr" in message
    assert model_figures(rlm("model.mhc_enabled=false"), log, 8) == ({}, "") and len(events) == 1
    assert model_figures(torch.nn.Linear(2, 2), log, 9) == ({}, "")
