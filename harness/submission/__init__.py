"""Turning runs into a submission: seeded multi-run campaigns and the MLPerf submission tree with the
official package, system-description and RCP checkers.

May import the harness root and review/; runs train/ only as subprocesses (`python -m harness run`).
"""
