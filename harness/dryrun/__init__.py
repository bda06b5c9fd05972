"""`mlperf-harness run CONFIG --dry_run`: one replica's train and eval step compiled under XLA on this host's
CPU at the real per-replica batch, before hardware is booked; FLOPs and memory from XLA, checked against the
devices the config names.

May import the harness root, train/ (the run's own pre-log checks, compiled steps and workload contract,
so the dry run compiles what the run compiles) and from plan/ only mfu.py (useful FLOPs in plan's units).
Only the command line imports it (`run --dry_run`), and hands its compile to `plan --compile`.
"""
