"""Reading MLPerf logs after the fact: parsing, the integrity checks the official checker lacks, olympic
scoring, RCP comparisons, `check` and review reports. Works on any log, the harness's own or public ones.

May import only the harness root (errors, mlperf); never train/, nn/ or submission/.
"""
