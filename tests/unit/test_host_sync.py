"""Issue 7: nothing in a training step waits on the host. A step's loss, gradient norm, clipping and
learning rate stay device tensors; only the log (one step late, at log intervals) reads them.

On a GPU a host read of a device value is a stream synchronisation; on a CPU it is the same aten call,
``_local_scalar_dense`` (``.item()``, ``float()``, ``bool()``), and the data-dependent-shape ops
(``nonzero``, ``masked_select``, ``unique``) that must copy a size back. A dispatch mode records
every such call inside the step, with the Python line that made it. The reads that never reach the
dispatcher on a CPU tensor (``.tolist()``, ``.numpy()``, ``.cpu()``, ``np.asarray``) are caught by
wrapping those methods; ``.to("cpu")`` of a CPU tensor is invisible here. Compiled code is out of its reach
(Dynamo refuses a dispatch mode; torchao's 8-bit AdamW compiles its step), so it runs eager layers and
fp32 AdamW."""

from __future__ import annotations

import contextlib
import traceback

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trainperf.parallel import parallelize as par
from trainperf.core.layout import resolve_layout
from trainperf.core.resolve import resolve_spec
from trainperf.train.engine import Engine
from trainperf.train.loop import build_optimizer, clip_gradients, set_lr
from trainperf.workloads.mini import mini_lora_defaults, mini_pretrain_defaults

aten = torch.ops.aten
HOST_READS = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
              aten.equal.default, aten._unique2.default, aten.unique_consecutive.default}


TENSOR_READS = ("tolist", "numpy", "cpu", "__array__")


def _where() -> str:
    return " <- ".join(reversed([f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.line}"
                                 for f in traceback.extract_stack()[-14:-2]
                                 if "trainperf" in f.filename or "test_host_sync" in f.filename]))


class HostReads(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls: list[str] = []
        self._saved: dict = {}

    def __enter__(self):
        for name in TENSOR_READS:  # Tensor methods that read a CPU tensor without an aten call
            real = self._saved[name] = getattr(torch.Tensor, name)

            def wrapped(tensor, *args, _real=real, _name=name, **kwargs):
                self.calls.append(f"Tensor.{_name}: {_where()}")
                return _real(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, wrapped)
        return super().__enter__()

    def __exit__(self, *exc):
        for name, real in self._saved.items():
            setattr(torch.Tensor, name, real)
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in HOST_READS:
            self.calls.append(f"{func}: {_where()}")
        return func(*args, **(kwargs or {}))


def _steps_reading_the_host(defaults, *overrides: str, steps: int = 2) -> list[str]:
    """Run ``steps`` full optimizer steps the way the training loop does (two micro-batches each,
    clipping on); the host reads made after the first step (the first may set up lazily)."""
    spec = resolve_spec(defaults, None, ["train.seed=3", "train.micro_batch_size=2", "train.global_batch_size=4",
                                         *overrides])
    resolve_layout(spec, 1)
    engine = Engine(spec, par.build_mesh(spec.parallel, "cpu"), torch.device("cpu"), None)
    opt = build_optimizer(engine.trainable, spec.train)
    g = torch.Generator().manual_seed(0)
    seq, vocab = 32, spec.model.vocab_size
    reads = HostReads()
    for step in range(steps + 1):
        micro = [(torch.randint(0, vocab, (2, seq), generator=g), torch.ones(2, seq)) for _ in range(2)]
        with reads if step > 0 else contextlib.nullcontext():  # step 0 is unrecorded
            loss = engine.train_step(micro, global_tokens=4.0 * (seq - 1))
            norm = clip_gradients(engine.trainable, 0.3)
            opt.step()
            opt.zero_grad(set_to_none=True)
            set_lr(opt, 1e-3 * (step + 1))
    assert torch.isfinite(loss) and norm > 0  # read after the recorded steps, as the lagged log does
    return reads.calls


@pytest.mark.parametrize("defaults, overrides", [
    (mini_lora_defaults, ("lora.dropout=0.1",)),
    (mini_lora_defaults, ("lora.dropout=0.1", "train.recompute=full")),
    (mini_lora_defaults, ("lora.dropout=0.1", "train.recompute=selective", "train.loss_chunk_tokens=16")),
    (mini_pretrain_defaults, ()),
], ids=["lora", "lora-full-recompute", "lora-selective-chunked-loss", "pretrain"])
def test_a_training_step_never_reads_a_device_value_on_the_host(gloo_group, defaults, overrides):
    calls = _steps_reading_the_host(defaults(), *overrides)
    assert not calls, "\n".join(calls)


def test_the_recorder_sees_a_host_read(gloo_group):
    """The check above can fail: a float() of the loss, a nonzero, a tolist and a .cpu() are each caught,
    with their lines; the Tensor methods are restored afterwards."""
    reads = HostReads()
    x = torch.randn(4, requires_grad=True)
    with reads:
        loss = (x * 2).sum()
        float(loss)
        torch.nonzero(x > 0)
        x.detach().tolist()
        loss.cpu()
    assert len(reads.calls) == 4, reads.calls
    assert "float(loss)" in reads.calls[0] and "nonzero" in reads.calls[1]
    assert reads.calls[2].startswith("Tensor.tolist") and "x.detach().tolist()" in reads.calls[2]
    assert reads.calls[3].startswith("Tensor.cpu") and "loss.cpu()" in reads.calls[3]
    assert torch.Tensor.tolist.__name__ == "tolist"
