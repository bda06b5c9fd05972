"""The run path: one timed run from a loaded config to a checked MLPerf log (run, loop, the workload
contract, progress, input files, weights_initialization events).

May import the harness root (config, errors, mlperf, sysinfo, runtime), nn/ and review/, and from plan/ only
mfu.py (the run's MFU line, in plan's units), data/ and export/; a workload only as the Config carries it
(`Config.workload_class`, `Config.cost_model`); never submission/ or the dry run.
"""
