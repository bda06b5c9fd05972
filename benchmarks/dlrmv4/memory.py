"""dlrmv4's bytes per device from the config alone, a lower bound, and the smallest mesh it fits on.

The tables are too big for any host to build, so no dry run compiles them; what they and their lookups take is
exact from the sizes: each device's row shard of every table (float32, rows padded to a multiple of the devices
splitting them), its row-wise Adagrad accumulators (one float32 per row), the tables' gradient (`owner_lookup`'s
is dense over the device's own rows, float32), the dense weights with their gradients and Adam's m and v
(16 B a parameter), and the looked-up rows of the batch the device computes with their gradients (float32,
one row per id: `owner_lookup` holds its distinct ids in a static buffer as long as the ids). The dense part's
activations are not counted: a configuration refused on this bound is refused on the truth.
"""
from __future__ import annotations

import dataclasses

from harness.config import Config

from benchmarks.dlrmv4.config import CONTEXT_TABLES, ITEM_TABLES
from benchmarks.dlrmv4.cost import forward_macs_and_params

# A platform the harness does not know is checked against the reference's own GPU, the AMD MI350X (288 GB
# HBM3E: mlcommons/training@a67b8459 recommendation_v4/README.MD).
REFERENCE_DEVICE = (288 * 10**9, "MI350X 288 GB (the reference's GPU)")
MESHES = tuple(2**k for k in range(11))  # devices splitting the tables' rows, tried from 1 to 1024


@dataclasses.dataclass
class DeviceBytes:
    tables: int
    accumulators: int
    table_gradients: int
    dense: int
    lookups: int

    @property
    def optimizer_state(self) -> int:
        """Row-wise Adagrad's accumulators and Adam's m and v (8 of the dense 16 B a parameter)."""
        return self.accumulators + self.dense // 2

    @property
    def total(self) -> int:
        return self.tables + self.accumulators + self.table_gradients + self.dense + self.lookups


def per_device(cfg: Config, shards: int, batch: int) -> DeviceBytes:
    """A lower bound of one device's bytes with the tables' rows split `shards` ways and `batch` samples' ids
    looked up on it."""
    model = cfg.model
    rows = sum(-(-n // shards) for n in model.tables.values())
    dim = model.embedding_dim
    _, dense, _ = forward_macs_and_params(cfg)
    ids = batch * (len(ITEM_TABLES) * (model.history_length + 1) + len(CONTEXT_TABLES))
    return DeviceBytes(tables=4 * rows * dim, accumulators=4 * rows, table_gradients=4 * rows * dim,
                       dense=16 * dense, lookups=2 * 4 * ids * dim)


def smallest_mesh(cfg: Config, batch: int, limit: int) -> int | None:
    """The fewest devices (a power of 2 up to 1024) whose row split keeps `per_device` within `limit`."""
    return next((n for n in MESHES if per_device(cfg, n, batch).total <= limit), None)


def gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


def refusal(cfg: Config, shards: int, batch: int, limit: tuple[int, str]) -> str | None:
    """One line refusing a layout whose lower bound exceeds the device's memory (None where it fits): the
    bound's parts, and the smallest mesh that fits, or why none does."""
    b = per_device(cfg, shards, batch)
    if b.total <= limit[0]:
        return None
    fits = smallest_mesh(cfg, batch, limit[0])
    if fits is None:
        tail = (f"no split of the rows fits: the looked-up rows alone take {gib(b.lookups)}, and every device "
                f"looks up all {batch:,} samples' ids (the lookup returns each id's row to every device splitting "
                f"the rows; a batch split over those devices needs ids routed to their owners, not built)")
    else:
        tail = f"the smallest mesh that fits splits the rows {fits} ways ({gib(per_device(cfg, fits, batch).total)})"
    return (f"dlrmv4 needs at least {gib(b.total)} per device with its tables' rows split {shards} ways: tables "
            f"{gib(b.tables)}, their gradients {gib(b.table_gradients)}, optimizer state {gib(b.optimizer_state)} "
            f"(row-wise Adagrad {gib(b.accumulators)}, Adam {gib(b.dense // 2)}), dense weights and gradients "
            f"{gib(b.dense // 2)}, looked-up rows and their gradients {gib(b.lookups)} for the {batch:,} samples "
            f"each device looks up (dense activations not counted), but one {limit[1]} holds {gib(limit[0])}; "
            f"{tail}")
