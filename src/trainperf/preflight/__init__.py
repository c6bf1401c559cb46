"""Preflight: is every GPU and link as fast as its datasheet?

* ``checks``  -- sizes, nccl-tests busbw conventions, groups and pairs, verdicts (``judge`` -> ``PreflightResult``;
  ``evaluate`` -> its JSON), ``measured_overrides`` (no torch);
* ``measure`` -- the measurements on every rank (GEMM, HBM copy, collective sweeps, send/recv pairs,
  plain-loop baselines);
* ``worker``  -- the torchrun entry point; ``cli`` -- ``trainperf preflight``.
"""

from trainperf.preflight.checks import (CheckResult, PreflightResult, busbw_factor, evaluate, judge,
                                        measured_overrides)

__all__ = ["CheckResult", "PreflightResult", "busbw_factor", "evaluate", "judge", "measured_overrides"]
