"""dlrmv4's table lookup on a 2-device DTensor mesh splitting the table's rows (`tests/helpers/dlrmv4_lookup_mesh.py`,
in a subprocess): the looked-up rows and the table's gradient (duplicate ids summed) equal numpy's, each device
holds half the rows, and no per-device program after DTensor's SPMD expansion holds a tensor of the whole
table's shape (nor of its [rows per device, devices, dim] view). The same holds for `owner_lookup` (the ids'
distinct rows read on their owners, gradients scattered into each owner's rows), whose rows, table gradient and,
after one row-wise Adagrad step from each lookup's gradient, tables and accumulators equal the one-hot lookup's."""
from __future__ import annotations

from tests.spmd_trace import run_spmd_helper


def test_row_sharded_lookup_holds_no_whole_table(tmp_path):
    result = run_spmd_helper("tests/helpers/dlrmv4_lookup_mesh.py", str(tmp_path / "dump"), timeout=600)
    assert result["forward"] < 1e-6 and result["grad"] < 1e-6, result
    assert result["shards"] == [[48, 8], [48, 8]]
    assert result["dumps"] >= 2 and result["whole"] == [], result
    assert result["owner"] == 0.0 and result["moved"] > 0.01, result  # exact, and the step did move the rows
    assert result["owner_shards"] == [[48, 8], [48, 8]]
