"""Per-rank step tracing: capture a window of training steps with torch.profiler on every rank
(``capture``), then analyse the Chrome traces offline, in pure Python (``analyze``): compute,
communication, overlap, exposed communication and idle time per step and rank; a collective table
with bytes, algbw and busbw per parallel dimension; rank skew and stragglers; top kernels/ops.
``trainperf trace`` (``cli``) runs a workload for a few steps with the profiler on and reports.
"""

TRACE_DIR = "trace"  # RUN_DIR/trace/rank{R}.json.gz + rank{R}.steps.json
SUMMARY_FILE = "trace_summary.json"  # RUN_DIR/trace_summary.json
