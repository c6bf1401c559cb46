"""Published MLPerf Training llama2_70b_lora results (time to train, minutes; olympic mean of 10 runs),
from the MLCommons results repositories
(github.com/mlcommons/training_results_v4.0 ... v5.1, results/*/llama2_70b_lora/result_*.txt)."""

SOURCE = "MLCommons training_results_v4.0-v5.1, llama2_70b_lora (github.com/mlcommons/training_results_v4.x/v5.x, results/*/llama2_70b_lora/result_*.txt)"

# (round, org, system, accelerator, GPUs, GBS, minutes)
LLAMA2_70B_LORA = [
    ("v4.1", "NVIDIA", "Eos 1xDGX H100 (NeMo, FP8)", "H100", 8, 8, 27.93),
    ("v4.1", "Supermicro", "AS-8125GS-TNHR", "H100", 8, 8, 27.54),
    ("v4.0", "JuniperNetworks", "H100_n1 (HF + DeepSpeed)", "H100", 8, 8, 116.09),
    ("v4.1", "NVIDIA", "DGX H200 (NeMo, FP8)", "H200", 8, 8, 24.12),
    ("v4.1", "Lenovo", "SR680a V3", "H200", 8, 8, 23.06),
    ("v5.0", "Supermicro", "AS-4125GS-TNHR2-LCC", "H200", 8, 8, 23.08),
    ("v5.1", "Dell", "1xXE9680x8H200", "H200", 8, 8, 23.37),
    ("v5.1", "Krai", "HPE Cray XD670 n2", "H200", 16, 8, 12.45),
    ("v5.1", "Krai", "HPE Cray XD670 n4", "H200", 32, 8, 6.83),
    ("v4.1", "NVIDIA", "Eos_n8", "H100", 64, 8, 4.57),
    ("v5.1", "Krai", "HPE Cray XD670 n8", "H200", 64, 16, 4.41),
    ("v4.1", "Azure", "ND_H200_v5 x64", "H200", 512, 64, 1.61),
    ("v4.1", "NVIDIA", "Eos_n128", "H100", 1024, 128, 1.19),
]
