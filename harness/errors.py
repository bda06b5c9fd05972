"""User-facing errors: one clear line and exit code 2, never a traceback wall."""


class HarnessError(Exception):
    """Bad input or environment the user can fix (config, data path, devices, TPU address).

    The CLI prints ``error: <message>`` and exits with code 2. Raise it with a message that names the
    problem and, where possible, the fix.
    """

    exit_code = 2


BAD_DATA_MARK = "bad input data:"
"""First item of an input pipeline's in-graph assertion (tf.debugging.Assert data) about a corrupt record
that validation could not reach: the run turns the op error into one `error:` line of the rest."""
