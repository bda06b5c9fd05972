"""Planning before hardware is booked: `mlperf-harness plan` projects time to train at N chips of a system
(systems/*.yaml: peak FLOP/s, HBM, interconnect, each figure sourced), from the model's cost, the collective
algorithms of the topology, the RCP tables' epochs to converge and an efficiency calibrated on MLPerf logs.

May import the harness root (config, errors) and review/ (RCP tables, log parsing); never train/ or the dry
run, whose compile the command line hands to `plan --compile`. `mfu.py` (a finished run's model FLOP/s and
MFU from the same cost modules and system files) is the one module the run path and the dry run import, and
imports nothing from train/.
"""
