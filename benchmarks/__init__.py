"""One sub-package per MLPerf workload; `registry` maps names to Workload classes."""
