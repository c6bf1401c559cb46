"""Unit tests of the training pieces that decide the reported numbers: the LR schedule, gradient
clipping, the train and eval loss definitions (eval checked by hand with math.log), the data
sampler's layout invariance, the FLOP/MFU accounting and the Markov source's optimal loss."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F

from trainperf.data.markov import MarkovSource, prompt_answer_mask
from trainperf.data.sampler import GlobalBatchSampler, eval_shards
from trainperf.data.tokens import TokenSplit
from trainperf.core.spec import LoRASpec, ModelSpec, TrainSpec
from trainperf.core import flops as metrics
from trainperf.core.hardware import peak_flops_for
from trainperf.train.loop import clip_gradients, evaluate, lr_at
from trainperf.model.loss import eval_loss_from_parts, per_sequence_loss, row_loss_sums, shift_targets, train_loss_sum


# ----------------------------------------------------------------------------------------------
# learning-rate schedule


def test_lr_warmup_is_linear_to_peak():
    t = TrainSpec(lr=4e-4, min_lr_ratio=0.1, warmup_steps=10, max_steps=110)
    for k in range(10):
        assert lr_at(k, t) == pytest.approx(4e-4 * (k + 1) / 10, rel=1e-12)
    assert lr_at(9, t) == pytest.approx(4e-4, rel=1e-12)  # the last warmup update is at the peak
    assert lr_at(10, t) == pytest.approx(4e-4, rel=1e-12)  # the cosine starts at the peak
    warm = [lr_at(k, t) for k in range(10)]
    assert all(b > a for a, b in zip(warm, warm[1:]))


def test_lr_cosine_values():
    lr, ratio = 4e-4, 0.1
    floor = lr * ratio
    t = TrainSpec(lr=lr, min_lr_ratio=ratio, warmup_steps=10, max_steps=110)  # decay over 100 steps
    assert lr_at(10 + 50, t) == pytest.approx((lr + floor) / 2, rel=1e-12)  # midpoint of the decay
    assert lr_at(10 + 25, t) == pytest.approx(floor + (lr - floor) * 0.5 * (1 + math.cos(math.pi / 4)), rel=1e-12)
    # the last optimizer update is step max_steps-1 (0-based): one decay step short of the floor
    assert lr_at(109, t) == pytest.approx(floor + (lr - floor) * 0.5 * (1 + math.cos(math.pi * 99 / 100)), rel=1e-12)
    assert floor < lr_at(109, t) < floor * 1.01
    assert lr_at(110, t) == pytest.approx(floor, rel=1e-12)  # the cosine ends at the floor ...
    assert lr_at(500, t) == pytest.approx(floor, rel=1e-12)  # ... and stays there
    # monotone non-increasing from the end of warmup on
    after = [lr_at(k, t) for k in range(9, 300)]
    assert all(b <= a for a, b in zip(after, after[1:]))
    assert min(after) >= floor * (1 - 1e-12)


def test_lr_without_warmup():
    lr = 1e-3
    t = TrainSpec(lr=lr, min_lr_ratio=0.0, warmup_steps=0, max_steps=200)
    assert lr_at(0, t) == lr
    assert lr_at(100, t) == pytest.approx(lr / 2, rel=1e-12)  # (lr + floor) / 2 with floor 0
    assert lr_at(200, t) == pytest.approx(0.0, abs=1e-18)
    assert lr_at(199, t) > 0
    vals = [lr_at(k, t) for k in range(250)]
    assert all(b <= a for a, b in zip(vals, vals[1:]))


def test_lr_decay_steps_override():
    lr, ratio = 2e-4, 0.25
    floor = lr * ratio
    t = TrainSpec(lr=lr, min_lr_ratio=ratio, warmup_steps=5, decay_steps=20, max_steps=1000)
    assert lr_at(5, t) == pytest.approx(lr, rel=1e-12)
    assert lr_at(5 + 10, t) == pytest.approx((lr + floor) / 2, rel=1e-12)
    assert lr_at(5 + 20, t) == pytest.approx(floor, rel=1e-12)
    assert lr_at(600, t) == pytest.approx(floor, rel=1e-12)
    # without the override the same step is still near the peak
    default = TrainSpec(lr=lr, min_lr_ratio=ratio, warmup_steps=5, max_steps=1000)
    assert lr_at(25, default) > 0.99 * lr
    assert lr_at(5 + 995 // 2, default) == pytest.approx(floor + (lr - floor) * 0.5 * (1 + math.cos(math.pi * 497 / 995)))


# ----------------------------------------------------------------------------------------------
# gradient clipping


def _linear_with_grads(scale: float) -> tuple[torch.nn.Linear, list[torch.Tensor]]:
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(5, 4)
    (scale * lin(x).pow(2).sum()).backward()
    return lin, [p.grad.clone() for p in lin.parameters()]


def _true_norm(grads: list[torch.Tensor]) -> float:
    return math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))


def test_clipping_takes_effect():
    lin, before = _linear_with_grads(1000.0)
    true = _true_norm(before)
    assert true > 100.0  # far above max_norm, so clipping must act
    norm = clip_gradients(list(lin.parameters()), 1.0)
    assert float(norm) == pytest.approx(true, rel=1e-5)  # returns the norm before clipping
    after = [p.grad for p in lin.parameters()]
    assert _true_norm(after) == pytest.approx(1.0, abs=1e-5)
    for a, b in zip(after, before):  # direction kept: a uniform rescale
        torch.testing.assert_close(a, b * (1.0 / true), rtol=1e-5, atol=1e-8)


def test_clipping_below_max_norm_leaves_grads():
    lin, before = _linear_with_grads(1e-3)
    true = _true_norm(before)
    assert true < 1.0
    norm = clip_gradients(list(lin.parameters()), 1.0)
    assert float(norm) == pytest.approx(true, rel=1e-5)
    for p, b in zip(lin.parameters(), before):
        assert torch.equal(p.grad, b)


def test_clipping_disabled_with_zero():
    lin, before = _linear_with_grads(1000.0)
    norm = clip_gradients(list(lin.parameters()), 0.0)
    assert float(norm) == pytest.approx(_true_norm(before), rel=1e-5)
    for p, b in zip(lin.parameters(), before):
        assert torch.equal(p.grad, b)


# ----------------------------------------------------------------------------------------------
# loss definitions

# vocab 3, 3 sequences of 4 tokens; loss_mask[t] marks token t as a target, predicted by logits[t-1]
HAND_IDS = torch.tensor([[0, 1, 2, 0],
                         [2, 2, 1, 0],
                         [1, 0, 0, 2]])
HAND_MASK = torch.tensor([[False, True, False, False],   # 1 target (token 1 at position 1)
                          [False, True, True, True],     # 3 targets
                          [False, False, False, False]], dtype=torch.bool)  # no target at all
HAND_LOGITS = torch.tensor([
    [[2.0, 0.5, -1.0], [0.0, 0.0, 3.0], [1.0, 2.0, 0.0], [0.3, 0.3, 0.3]],
    [[0.0, -2.0, 4.0], [1.0, 3.0, -1.0], [2.5, 0.0, 0.0], [0.0, 0.0, 0.0]],
    [[-5.0, 5.0, 0.0], [5.0, -5.0, 0.0], [0.0, 9.0, -9.0], [1.0, 1.0, 1.0]],
])


def _nll(logit_row: list[float], token: int) -> float:
    z = sum(math.exp(v) for v in logit_row)
    return -math.log(math.exp(logit_row[token]) / z)


def _hand_token_losses() -> list[list[float]]:
    out = []
    for b in range(3):
        seq = []
        for t in range(1, 4):
            if HAND_MASK[b, t]:
                seq.append(_nll(HAND_LOGITS[b, t - 1].tolist(), int(HAND_IDS[b, t])))
        out.append(seq)
    return out


def test_eval_loss_is_mean_of_per_sequence_means():
    toks = _hand_token_losses()
    assert [len(s) for s in toks] == [1, 3, 0]
    expected = (toks[0][0] + sum(toks[1]) / 3) / 2  # sequences with targets only, unweighted
    token_weighted = (toks[0][0] + sum(toks[1])) / 4
    assert abs(expected - token_weighted) > 1e-3  # the two definitions are distinguishable here

    per_seq, has = per_sequence_loss(HAND_LOGITS, HAND_IDS, HAND_MASK)
    assert has.tolist() == [True, True, False]
    assert float(per_seq[0]) == pytest.approx(toks[0][0], rel=1e-6)
    assert float(per_seq[1]) == pytest.approx(sum(toks[1]) / 3, rel=1e-6)
    got = eval_loss_from_parts(per_seq, has)
    assert got == pytest.approx(expected, rel=1e-6, abs=1e-7)
    assert abs(got - token_weighted) > 1e-3


def test_train_loss_is_token_mean_on_hand_batch():
    toks = _hand_token_losses()
    token_weighted = (toks[0][0] + sum(toks[1])) / 4
    got = float(train_loss_sum(HAND_LOGITS, HAND_IDS, HAND_MASK)) / float(HAND_MASK[:, 1:].sum())
    assert got == pytest.approx(token_weighted, rel=1e-6)


def test_train_loss_sum_over_global_tokens_is_token_mean_ce():
    g = torch.Generator().manual_seed(3)
    b, s, v = 6, 12, 11
    logits = torch.randn(b, s, v, generator=g) * 2
    ids = torch.randint(0, v, (b, s), generator=g)
    mask = torch.rand(b, s, generator=g) < 0.5
    mask[0] = False  # a row without targets
    mask[1, 1:] = True  # a row with every target
    n = float(mask[:, 1:].sum())
    targets = torch.where(mask[:, 1:], ids[:, 1:], torch.full_like(ids[:, 1:], -100))
    ref = F.cross_entropy(logits[:, :-1].reshape(-1, v), targets.reshape(-1), ignore_index=-100)
    got = train_loss_sum(logits, ids, mask) / n
    assert float(got) == pytest.approx(float(ref), rel=1e-6)
    # micro-batches, each divided by the *global* count, add up to the same token mean
    acc = sum(train_loss_sum(logits[i:i + 2], ids[i:i + 2], mask[i:i + 2]) / n for i in range(0, b, 2))
    assert float(acc) == pytest.approx(float(ref), rel=1e-6)
    # ... which is not the mean of the micro-batch means
    mb_means = [float(train_loss_sum(logits[i:i + 2], ids[i:i + 2], mask[i:i + 2]) / mask[i:i + 2, 1:].sum())
                for i in range(0, b, 2)]
    assert abs(sum(mb_means) / len(mb_means) - float(ref)) > 1e-3


class _FixedLogits(torch.nn.Module):
    """logits[b, t] = table[ids[b, t]]: fixed logits, whatever batch a row lands in."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.register_buffer("table", table)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table[ids]


class _OneModelEngine:
    """The part of the Engine protocol evaluate() uses, around one plain module."""

    def __init__(self, model):
        self.model = model
        self.training = True

    def train(self, mode: bool = True):
        self.training = mode
        self.model.train(mode)

    def eval_batch(self, ids, mask):
        return row_loss_sums(self.model(ids), *shift_targets(ids, mask))


def test_evaluate_on_one_process_group(gloo_group):
    g = torch.Generator().manual_seed(11)
    v, s = 7, 9
    table = torch.randn(v, v, generator=g) * 2
    ids = torch.randint(0, v, (5, s), generator=g)
    mask = torch.zeros(5, s, dtype=torch.bool)
    mask[0, 7:] = True   # row 0 (the padding row) has 2 targets
    mask[1, 1:] = True   # 8 targets
    mask[2, 4:6] = True  # 2 targets
    # row 3: no targets
    mask[4, 2:] = True   # 7 targets
    # make row 0's targets the model's top choice so its loss is far from the others
    for t in (7, 8):
        ids[0, t] = int(table[ids[0, t - 1]].argmax())
    split = TokenSplit(input_ids=ids, loss_mask=mask)
    model = _OneModelEngine(_FixedLogits(table))
    model.train()

    per_seq, has = per_sequence_loss(model.model(ids), ids, mask)
    ref = eval_loss_from_parts(per_seq, has)

    batches = eval_shards(5, 0, 1, 2)
    assert len(batches) == 3
    weights = torch.cat([w for _, w in batches])
    assert weights.tolist() == [1, 1, 1, 1, 1, 0]  # one padding slot
    assert int(batches[-1][0][-1]) == 0  # ... which repeats row 0

    got = evaluate(model, split, batches, torch.device("cpu"))
    assert got == pytest.approx(ref, rel=1e-6)
    assert model.training  # put back in training mode

    # had the padding row counted, the number would move: the weight-0 row really is ignored
    counted = float((per_seq[has].sum() + per_seq[0]) / (has.sum() + 1))
    assert abs(counted - ref) > 1e-3
    # any amount of extra weight-0 padding leaves it unchanged; so does a different batching
    extra = batches + [(torch.tensor([0, 0]), torch.zeros(2, dtype=torch.float64))] * 3
    assert evaluate(model, split, extra, torch.device("cpu")) == pytest.approx(ref, rel=1e-6)
    assert evaluate(model, split, eval_shards(5, 0, 1, 5), torch.device("cpu")) == pytest.approx(ref, rel=1e-6)
    assert evaluate(model, split, eval_shards(5, 0, 1, 4), torch.device("cpu")) == pytest.approx(ref, rel=1e-6)
    # and it is the per-sequence mean, not the token mean
    token_mean = float((per_seq * mask[:, 1:].sum(1)).sum() / mask[:, 1:].sum())
    assert abs(got - token_mean) > 1e-3


# ----------------------------------------------------------------------------------------------
# data sampler


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_global_batch_is_layout_invariant(dp):
    sampler = GlobalBatchSampler(num_rows=20, global_batch_size=8, seed=7)
    reference = GlobalBatchSampler(num_rows=20, global_batch_size=8, seed=7)
    for step in range(8):
        expected = reference.global_batch(step)
        parts = []
        for r in range(dp):
            micro = sampler.local_micro_batches(step, r, dp, 2)
            assert len(micro) == 8 // dp // 2
            assert all(len(m) == 2 for m in micro)
            parts.extend(micro)
        assert torch.equal(torch.cat(parts), expected)
        assert sorted(torch.cat(parts).tolist()) == sorted(expected.tolist())


def test_global_batches_cover_epochs_without_repeats():
    sampler = GlobalBatchSampler(num_rows=20, global_batch_size=8, seed=7)
    stream = torch.cat([sampler.global_batch(s) for s in range(10)])  # positions 0..79: 4 epochs
    epochs = [stream[i * 20:(i + 1) * 20] for i in range(4)]
    for e in epochs:
        assert sorted(e.tolist()) == list(range(20))
    assert not torch.equal(epochs[0], epochs[1])  # reshuffled each epoch
    # deterministic in (seed, step), whatever order steps are asked in
    fresh = GlobalBatchSampler(num_rows=20, global_batch_size=8, seed=7)
    for s in (9, 2, 0, 5):
        assert torch.equal(fresh.global_batch(s), stream[s * 8:(s + 1) * 8])
    other = GlobalBatchSampler(num_rows=20, global_batch_size=8, seed=8)
    assert not torch.equal(other.global_batch(0), stream[:8])


@pytest.mark.parametrize("num_rows", [1, 5, 10, 13])
@pytest.mark.parametrize("dp", [1, 2, 3, 4])
@pytest.mark.parametrize("bs", [1, 2, 3])
def test_eval_shards(num_rows, dp, bs):
    shards = [eval_shards(num_rows, r, dp, bs) for r in range(dp)]
    assert len({len(s) for s in shards}) == 1  # every rank runs the same number of batches
    seen = []
    for s in shards:
        for idx, w in s:
            assert len(idx) == bs and len(w) == bs and w.dtype == torch.float64
            assert set(w.tolist()) <= {0.0, 1.0}
            seen.extend(idx[w == 1].tolist())
            assert (idx[w == 0] == 0).all()
            assert ((idx >= 0) & (idx < num_rows)).all()
    assert sorted(seen) == list(range(num_rows))  # every row exactly once at weight 1


# ----------------------------------------------------------------------------------------------
# FLOPs, MFU, peak


SMALL = ModelSpec(vocab_size=100, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2)


def test_linear_params_small_by_hand():
    # head_dim 8: q 32x32, k/v 32x16, o 32x32, gate/up/down 32x64 -> 9216 per layer; lm_head 32x100
    lp = metrics.linear_params(SMALL)
    assert lp == {"q_proj": 2048, "k_proj": 1024, "v_proj": 1024, "o_proj": 2048,
                  "gate_proj": 4096, "up_proj": 4096, "down_proj": 4096, "lm_head": 3200}
    assert sum(lp.values()) == 21632


def test_train_flops_lora_by_hand():
    seq = 16
    lora = LoRASpec(rank=4, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    n_linear = 21632
    # per layer: q 4*(32+32), k 4*(32+16), v 4*(32+16), o 4*(32+32) = 896; two layers
    n_lora = 2 * (4 * 64 + 4 * 48 + 4 * 48 + 4 * 64)
    assert n_lora == 1792 == metrics.lora_params(SMALL, lora)
    attn = 3 * 2 * seq * (4 * 8) * 2  # 3 x (2*S*d) x L
    assert attn == 6144
    assert metrics.train_flops_per_token(SMALL, lora, seq) == 4 * n_linear + 6 * n_lora + attn == 103424
    assert metrics.train_flops_per_token(SMALL, LoRASpec(rank=0), seq) == 6 * n_linear + attn == 135936


def test_llama2_7b_linear_params():
    m = ModelSpec(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_layers=32, num_heads=32,
                  num_kv_heads=32)
    # per layer 4*4096^2 (attention) + 3*4096*11008 (MLP) = 202,375,168; x32 + lm_head 4096*32000
    by_hand = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008) + 4096 * 32000
    assert by_hand == 6_607_077_376
    n = sum(metrics.linear_params(m).values())
    assert abs(n - 6_607_077_376) / 6_607_077_376 < 0.01
    assert n == by_hand
    # with the embedding and the 65 RMSNorm weights: the familiar 6.74B of Llama-2-7B
    assert metrics.total_params(m) == 6_738_415_616


def test_peak_flops_and_mfu():
    assert peak_flops_for("NVIDIA H200") == 989e12
    assert peak_flops_for("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops_for("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops_for("NVIDIA H100 PCIe") == 756e12
    assert peak_flops_for("cpu") is None
    assert metrics.mfu(1e9, 1000.0, None) is None
    assert metrics.mfu(1e9, 1000.0, 1e13) == pytest.approx(0.1)


# ----------------------------------------------------------------------------------------------
# Markov source


def test_markov_optimal_loss_near_entropy_rate():
    src = MarkovSource(vocab_size=32, branching=4, seed=0)
    ids = src.sample(256, 64, seed=1)
    assert ids.shape == (256, 64)
    assert (src.probs[ids[:, :-1], ids[:, 1:]] > 0).all()  # every transition is possible
    split = TokenSplit(input_ids=ids, loss_mask=torch.ones(256, 64, dtype=torch.bool))
    h = src.entropy_rate()
    assert 0.1 < h < math.log(4)
    assert abs(src.optimal_loss(split) - h) < 0.05
    # the fine-tuning layout (targets only after a prompt) gives the same rate
    ft = TokenSplit(input_ids=ids, loss_mask=prompt_answer_mask(256, 64, 16))
    assert abs(src.optimal_loss(ft) - h) < 0.05


def test_markov_rows_and_redraw():
    src = MarkovSource(vocab_size=32, branching=4, seed=0)
    orig = src.probs.clone()
    torch.testing.assert_close(src.probs.sum(1), torch.ones(32, dtype=torch.float64), rtol=0, atol=1e-12)
    assert ((src.probs > 0).sum(1) == 4).all()
    rows = [3, 17, 30]
    other = src.with_rows_redrawn(rows, seed=5, branching=4)
    assert torch.equal(src.probs, orig)  # the original is untouched
    torch.testing.assert_close(other.probs.sum(1), torch.ones(32, dtype=torch.float64), rtol=0, atol=1e-12)
    changed = [i for i in range(32) if not torch.equal(other.probs[i], orig[i])]
    assert changed == rows
    assert ((other.probs > 0).sum(1) == 4).all()
    assert other.entropy_rate() != src.entropy_rate()


def test_chunked_loss_matches_full_logits_loss_and_grads():
    """train.loss_chunk_tokens: the same loss sum and the same gradients, chunk size not dividing the tokens."""
    from trainperf.model.llama import LlamaForCausalLM

    torch.manual_seed(0)
    cfg = ModelSpec(vocab_size=50, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=4, num_kv_heads=2,
                    max_position_embeddings=64)
    model = LlamaForCausalLM(cfg)
    ids = torch.randint(0, 50, (3, 40))
    mask = torch.rand(3, 40) > 0.3
    labels, label_mask = shift_targets(ids, mask)
    full = (F.cross_entropy(model(ids).reshape(-1, 50), labels.reshape(-1), reduction="none")
            * label_mask.reshape(-1).float()).sum()
    full.backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    chunked = model(ids, labels=labels, label_mask=label_mask, loss_chunk_tokens=17)
    chunked.backward()
    assert torch.allclose(chunked, full, rtol=1e-6, atol=1e-5)
    for n, p in model.named_parameters():
        assert torch.allclose(p.grad, ref[n], rtol=1e-5, atol=1e-6), n


def test_lagged_log_reads_device_values_one_step_late():
    from trainperf.train.clock import LaggedLog

    out = []
    log = LaggedLog(out.append)
    log.add({"step": 1, "loss": torch.tensor(2.0)})
    log.lag()
    assert out == []  # the newest record waits for the next step's work to be queued
    log.add({"step": 2, "loss": torch.tensor(1.5)})
    log.lag()
    assert out == [{"step": 1, "loss": 2.0}] and isinstance(out[0]["loss"], float)
    log.flush()
    assert [r["step"] for r in out] == [1, 2]


def test_step_clock_on_cpu_times_each_step():
    import time as _time

    from trainperf.train.clock import StepClock

    clock = StepClock(cuda=False)
    for pause in (0.02, 0.0, 0.04):
        clock.start()
        _time.sleep(pause)
        clock.stop()
    t = clock.times()
    assert len(t) == 3 and clock.completed() == 3
    assert t[0] >= 0.02 and t[2] >= 0.04 and t[1] < 0.02
    assert clock.times(2) == t[:2]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_step_clock_on_gpu_reads_events_without_a_sync_per_step():
    from trainperf.train.clock import StepClock

    clock = StepClock(cuda=True)
    a = torch.randn(4096, 4096, device="cuda")
    for _ in range(3):
        clock.start()
        for _ in range(20):
            a = a @ a / 64
        clock.stop()
    assert clock.completed() <= 3  # asked without waiting
    t = clock.times()
    assert len(t) == 3 and all(x > 0 for x in t)


def test_expandable_segments_joins_the_allocator_settings_the_environment_already_has(monkeypatch):
    from trainperf.core.spec import RunSpec
    from trainperf.train.loop import apply_cuda_alloc_conf, cuda_alloc_conf

    spec = RunSpec(workload="x")
    assert cuda_alloc_conf(spec, None) is None and cuda_alloc_conf(spec, "max_split_size_mb:512") == "max_split_size_mb:512"
    spec.hardware.expandable_segments = True
    assert cuda_alloc_conf(spec, None) == "expandable_segments:True"
    assert cuda_alloc_conf(spec, "max_split_size_mb:512") == "max_split_size_mb:512,expandable_segments:True"
    assert cuda_alloc_conf(spec, "expandable_segments:False") == "expandable_segments:False"  # the user's word wins
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    apply_cuda_alloc_conf(spec)  # what the launcher does before torchrun starts the workers
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


@pytest.mark.slow
def test_eight_bit_adamw_keeps_its_moments_in_a_quarter_of_the_bytes_and_steps_like_adamw():
    """train.optimizer=adamw8bit: torchao's AdamW8bit, its moments 1 byte per element plus an fp32 scale
    per 256 and a code book per tensor (the run summary's optimizer_state_gib counts them through the
    subclass); three steps move the weights as fp32 AdamW does, to within the quantisation; the rate is
    a tensor set in place."""
    from trainperf.core.spec import TrainSpec
    from trainperf.train.loop import build_optimizer, optimizer_state_bytes, set_lr

    torch.manual_seed(0)
    weights = {name: torch.nn.Parameter(torch.randn(256, 256)) for name in ("adamw", "adamw8bit")}
    weights["adamw8bit"].data.copy_(weights["adamw"].data)
    start = weights["adamw"].detach().clone()
    grad = torch.randn(256, 256)
    t = TrainSpec(lr=1e-2, warmup_steps=0, max_steps=10, weight_decay=0.1)
    opts = {}
    for name, w in weights.items():
        t.optimizer = name
        opts[name] = build_optimizer([w], t)
        for _ in range(3):  # torchao's first step updates from the moments before quantising them
            w.grad = grad.clone()
            opts[name].step()
    assert type(opts["adamw8bit"]).__name__ == "AdamW8bit" and type(opts["adamw"]) is torch.optim.AdamW
    n = 256 * 256
    assert optimizer_state_bytes(opts["adamw"]) == 8 * n + 4  # two fp32 moments + the step counter
    # codes, a scale per 256 and each moment's 256-entry fp32 code book, + the step counter
    assert optimizer_state_bytes(opts["adamw8bit"]) == 2 * n + 2 * 4 * (n // 256) + 2 * 4 * 256 + 4
    assert (weights["adamw"] - start).abs().mean() > 1.5 * t.lr  # three Adam steps: about lr per weight each
    gap = (weights["adamw"] - weights["adamw8bit"]).abs()
    # from the second step the 8-bit moments differ (fp32 moments would agree to ~1e-7 lr) and stay close
    # for almost every weight; the few whose tiny second moment shares a block with large ones move up
    # to ~2 lr apart (blockwise quantisation, as in bitsandbytes)
    assert gap.max() > 1e-3 * t.lr and gap.mean() < 0.05 * t.lr
    assert torch.quantile(gap.flatten(), 0.99) < 0.25 * t.lr
    set_lr(opts["adamw8bit"], 3e-3)
    set_lr(opts["adamw"], 3e-3)
    assert float(opts["adamw8bit"].param_groups[0]["lr"]) == pytest.approx(3e-3)
    assert isinstance(opts["adamw8bit"].param_groups[0]["lr"], torch.Tensor)
    assert opts["adamw"].param_groups[0]["lr"] == 3e-3


def test_uncacheable_graph_warning_is_dropped_and_other_cache_key_failures_still_show(caplog):
    """Building AdamW8bit installs a filter on Inductor's cache logger (once): the "Failed to pickle
    cache key" warning whose cause is pickle's cyclic-object refusal (torchao's 8-bit state) is dropped;
    the same warning with another cause, and other records of that logger, still reach the handlers."""
    import logging

    from trainperf.train.loop import _UncacheableGraphFilter, build_optimizer

    logger = logging.getLogger("torch._inductor.codecache")
    t = TrainSpec(lr=1e-3, warmup_steps=0, max_steps=10, optimizer="adamw8bit")
    for _ in range(2):
        build_optimizer([torch.nn.Parameter(torch.randn(64, 64))], t)
    assert sum(isinstance(f, _UncacheableGraphFilter) for f in logger.filters) == 1

    def warn_from(exc: Exception) -> None:
        try:
            raise exc
        except Exception:
            logger.warning("Failed to pickle cache key", exc_info=True)

    def seen() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == logger.name]

    with caplog.at_level(logging.WARNING, logger=logger.name):
        warn_from(ValueError("fast mode: can't pickle cyclic objects"))
        assert seen() == []
        warn_from(TypeError("cannot pickle 'generator' object"))
        logger.warning("fx graph unable to write to cache")
    assert seen() == ["Failed to pickle cache key", "fx graph unable to write to cache"]
