"""A run's trained weights after its end: `final_weights.safetensors` written beside the log and
`mlperf-harness export`, which turns them into a Hugging Face checkpoint on the host (no device, no model).

May import the harness root and nn/ (the Hugging Face checkpoint format); the run path (train/) imports it
to write the weights after run_stop.
"""
