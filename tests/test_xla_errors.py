"""Only compile failures are labelled "does not compile under XLA":
out of memory is one line naming the bytes, runtime failures (NCCL, a lost peer) pass through. The
errors are constructed as TensorFlow raises them; the texts follow XLA's and TensorFlow's wording."""
from __future__ import annotations

import pytest
import tensorflow as tf

from harness.train.xla_errors import xla_compile_error

pytestmark = pytest.mark.quick

# XLA:GPU's executable running out of memory (its message names XLA, which used to be enough for the label).
XLA_GPU_OOM = ("Graph execution error:\n\nDetected at node cluster_0_1/xla_run defined at (most recent call "
               "last):\n  File \"/src/harness/train/loop.py\", line 373, in run_timed\n\nOut of memory while "
               "trying to allocate 17179869184 bytes.\nBufferAssignment OOM Debugging.\nBufferAssignment "
               "stats:\n             parameter allocation:    1.2GiB\nXLA Label: fusion\n"
               "\t [[{{node cluster_0_1/xla_run}}]]")
BFC_OOM = ("Graph execution error:\n\nAllocator (GPU_0_bfc) ran out of memory trying to allocate 4.00GiB "
           "(rounded to 4294967296)requested by op XLA jit_compile cluster\n")
TENSOR_OOM = "OOM when allocating tensor with shape[256,1024,1024] and type float on /job:localhost/device:GPU:0"
TPU_HBM = ("XLA:TPU compile permanent error. Compilation failure: Ran out of memory in memory space hbm. "
           "Used 20.50G of 16.00G hbm. Exceeded hbm capacity by 4.50G.")


@pytest.mark.parametrize("text,expected", [
    (XLA_GPU_OOM, "tried to allocate 17179869184 bytes (16.00 GiB)"),
    (BFC_OOM, "tried to allocate 4294967296 bytes (4.00 GiB)"),
    (TENSOR_OOM, "tried to allocate a float tensor of shape [256,1024,1024]"),
    (TPU_HBM, "the program needs 20.50G of 16.00G HBM"),
])
def test_out_of_memory_is_one_line_naming_the_bytes(text, expected):
    error = xla_compile_error(tf.errors.ResourceExhaustedError(None, None, text), "resnet", "train")
    assert error is not None
    line = str(error)
    assert line.startswith(f"resnet train step ran out of device memory: {expected}; "), line
    assert "does not compile" not in line and "\n" not in line


@pytest.mark.parametrize("error", [
    tf.errors.InternalError(None, None, "XLA:GPU NCCL operation ncclAllReduce(...) failed: unhandled cuda "
                                        "error. Last NCCL warning: Cuda failure 'out of memory'"),
    tf.errors.UnavailableError(None, None, "Collective ops is aborted by: XLA:GPU collective: task 1 is "
                                           "unhealthy (stopped sending heartbeats)"),
    # A runtime check inside an XLA program, not a compile failure.
    tf.errors.InvalidArgumentError(None, None, "XLA: indices[3] = 70000 is not in [0, 32000) {{node gather}}"),
    ValueError("shapes differ under jit_compile"),
])
def test_runtime_failures_pass_through(error):
    assert xla_compile_error(error, "resnet", "train") is None


def test_compile_failures_keep_their_label():
    detected = tf.errors.InvalidArgumentError(None, None, (
        "Detected unsupported operations when trying to compile graph __inference_step_6[_XlaMustCompile=true] "
        "on XLA_GPU_JIT: AsString (No registered 'AsString' OpKernel for XLA_GPU_JIT devices compatible with "
        "node {{node AsString}}){{node AsString}}\n  File \"/src/benchmarks/toy/model.py\", line 12, in step"))
    line = str(xla_compile_error(detected, "toy", "eval"))
    assert line == ("toy eval step does not compile under XLA: AsString (no XLA_GPU_JIT kernel), created at "
                    "model.py:12 in step")
    constant = tf.errors.InvalidArgumentError(None, None, "Input 1 to node `Reshape` with op Reshape must be a "
                                                          "compile-time constant.")
    assert "does not compile under XLA: Input 1 to node `Reshape`" in str(xla_compile_error(constant, "t", "train"))
    # The dry run's compiler-IR path wraps the same text in a ValueError.
    ir = ValueError("Failed getting HLO text: 'Input 1 to node `Reshape` with op Reshape must be a compile-time "
                    "constant.'")
    assert "does not compile under XLA: Input 1 to node" in str(xla_compile_error(ir, "t", "train"))
    unimplemented = tf.errors.UnimplementedError(None, None, "XLA compilation requires a fixed tensor list size")
    assert "does not compile under XLA" in str(xla_compile_error(unimplemented, "t", "train"))


@pytest.mark.parametrize("jit_compile", [False, True])
def test_first_call_out_of_memory_is_one_line_with_or_without_xla(jit_compile):
    """The warm-up's first call translates out of memory on every runtime, not only under XLA; other
    errors pass through untouched."""
    import types

    from harness.errors import HarnessError
    from harness.train.loop import first_call_errors_as_one_line

    runtime = types.SimpleNamespace(jit_compile=jit_compile)
    workload = types.SimpleNamespace(NAME="resnet")
    with pytest.raises(HarnessError) as caught:
        with first_call_errors_as_one_line(runtime, workload, "train"):
            raise tf.errors.ResourceExhaustedError(None, None, TENSOR_OOM)
    assert str(caught.value).startswith("resnet train step ran out of device memory: tried to allocate a float "
                                        "tensor of shape [256,1024,1024]; ")
    other = tf.errors.InternalError(None, None, "NCCL failure")
    with pytest.raises(tf.errors.InternalError):
        with first_call_errors_as_one_line(runtime, workload, "eval"):
            raise other
