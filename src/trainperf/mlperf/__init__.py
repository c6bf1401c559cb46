"""MLPerf Training, torch-free: the benchmarks' recipes and closed-division rules, the MLPerf log,
scoring (olympic mean, RCP check, submission package) and published results."""
