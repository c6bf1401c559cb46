"""LoRA dropout on DTensors under torch.compile, on one GPU: a one-rank tensor-parallel mesh (TP2+SP's
code path, no second GPU needed), a 2-layer LoRA model, three steps eager and compiled, with the old
draw (``bernoulli_`` on the DTensor) and with the current one (``model/lora.py: lora_dropout``, a plain
global-shape mask cut to the input's placements).

    torchrun --standalone --nproc-per-node 1 bench/tp_dropout_compile_probe.py

1 x H200, torch 2.11, 2026-11-30: the old draw fails compiled (fake-tensor error on bernoulli_ of a
DTensor, what made `run` refuse compile + TP + dropout); the new one compiles, its losses next to eager's.
"""

import json

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import trainperf.model.lora as lora_mod
from trainperf.model.llama import LlamaForCausalLM
from trainperf.parallel.parallelize import apply_compile, apply_tp
from trainperf.core.spec import LoRASpec, ModelSpec


def bernoulli_on_dtensor(x, p, training):
    """The former draw: DTensor's own random op (its CUDA RNG tracker)."""
    from torch.distributed.tensor import DTensor

    if not training or p == 0:
        return x
    if isinstance(x, DTensor):
        keep = torch.empty_like(x, dtype=torch.bool).bernoulli_(1.0 - p)
        return x * keep * (1.0 / (1.0 - p))
    return torch.nn.functional.dropout(x, p, True)


def three_losses(mesh, compiled: bool) -> list[float]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    cfg = ModelSpec(vocab_size=512, hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4,
                    num_kv_heads=4, max_position_embeddings=256)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    lora_mod.apply_lora(model, LoRASpec(rank=4, alpha=8, dropout=0.1))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.1)  # B = 0 would hide the adapters from the loss
    apply_tp(model, mesh, sequence_parallel=True)
    if compiled:
        apply_compile(model)
    model.train()
    torch.manual_seed(7)
    losses = []
    for _ in range(3):
        with torch.autocast("cuda", torch.bfloat16):
            loss = model(torch.randint(0, 512, (1, 256), device="cuda")).to_local().float().square().mean()
        loss.backward()
        losses.append(loss.item())
    return losses


def main() -> None:
    dist.init_process_group("nccl")
    torch.cuda.set_device(0)
    mesh = init_device_mesh("cuda", (1,), mesh_dim_names=("tp",))
    current = lora_mod.lora_dropout
    result = {}
    for name, draw in (("current", current), ("bernoulli_on_dtensor", bernoulli_on_dtensor)):
        lora_mod.lora_dropout = draw
        for compiled in (False, True):
            try:
                result[f"{name} compiled={compiled}"] = three_losses(mesh, compiled)
            except Exception as exc:  # noqa: BLE001 -- the probe reports what compile raised
                result[f"{name} compiled={compiled}"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    print("RESULT", json.dumps(result, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
