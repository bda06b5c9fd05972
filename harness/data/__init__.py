"""A run's data beyond one input pipeline: its files checked against what the references publish
(`verify.py`: `mlperf-harness data verify` and the closed run's pre-log check) and the tf.data service that
can feed the run from other hosts (`service.py`: `mlperf-harness data-service`, one service job per epoch).

May import the harness root and, from train/, only the input building blocks every workload's data source
uses (datafiles.py, input_pipeline.py) and reference.py's config lookup; the run path (train/) imports it.
"""
