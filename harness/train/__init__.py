"""The run path: one timed run from a loaded config to a checked MLPerf log (run, loop, the workload
contract, progress, input files, weights_initialization events).

May import the harness root (config, errors, mlperf, sysinfo, runtime), nn/ and review/, and from plan/ only
mfu.py (the run's MFU line, in plan's units); workloads only through benchmarks.registry; never submission/.
"""
