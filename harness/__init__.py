"""Workload-agnostic machinery of the MLPerf training harness."""
