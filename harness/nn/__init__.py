"""Building blocks that workloads compose: layers whose variables come from the runtime, and the
read-once optimizers and learning-rate schedules.

May import only the harness root (errors, runtime); never train/, review/ or submission/.
"""
