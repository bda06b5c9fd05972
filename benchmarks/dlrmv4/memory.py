"""dlrmv4's bytes per device from the config alone, a lower bound, and the smallest mesh it fits on.

The tables are too big for any host to build, so no dry run compiles them; what they and their lookups take is
exact from the sizes: each device's row shard of every table (float32, rows padded to a multiple of the devices
splitting them), its row-wise Adagrad accumulators (one float32 per row), the tables' gradient (dense over the
device's own rows, float32, in both lookups), the dense weights with their gradients and Adam's m and v (16 B a
parameter), and the looked-up rows of the ids the device handles with their gradients (float32, one row per id).

Which ids a device handles is the layout's: `owner_lookup` (batch not split over the rows' devices) returns
every id of the step to every device of the split; `routed_lookup` (batch split over them, `routed`) handles
the device's batch share only, and adds its routing buffers: per lookup, n owners x `routed_capacity` rows
arriving from the owners and as many row gradients sent back (float32). The dense part's activations and the
lookups' sort buffers are not counted: a configuration refused on this bound is refused on the truth.
"""
from __future__ import annotations

import dataclasses

from harness.config import Config

from benchmarks.dlrmv4.config import CONTEXT_TABLES, ITEM_TABLES
from benchmarks.dlrmv4.cost import forward_macs_and_params
from benchmarks.dlrmv4.owner_lookup import routed_capacity

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
    routing: int = 0

    @property
    def optimizer_state(self) -> int:
        """Row-wise Adagrad's accumulators and Adam's m and v (8 of the dense 16 B a parameter)."""
        return self.accumulators + self.dense // 2

    @property
    def total(self) -> int:
        return self.tables + self.accumulators + self.table_gradients + self.dense + self.lookups + self.routing


def lookups_per_sample(cfg: Config) -> list[tuple[str, int]]:
    """(table, ids per sample) of each lookup the model makes (benchmarks/dlrmv4/model.py `logits`): the item
    tables over history + candidate, the 8 contextual tables, and the item tables again for the candidate."""
    h = cfg.model.history_length + 1
    return [(t, h) for t in ITEM_TABLES] + [(t, 1) for t in CONTEXT_TABLES] + [(t, 1) for t in ITEM_TABLES]


def per_device(cfg: Config, shards: int, batch: int, routed: bool = False) -> DeviceBytes:
    """A lower bound of one device's bytes with the tables' rows split `shards` ways and `batch` samples' ids
    looked up on it (`routed`: routed to their owners, `batch` being the device's share)."""
    model = cfg.model
    rows = sum(-(-n // shards) for n in model.tables.values())
    dim = model.embedding_dim
    _, dense, _ = forward_macs_and_params(cfg)
    calls = lookups_per_sample(cfg)
    ids = batch * sum(per for _, per in calls)
    routing = 0
    if routed:
        slots = sum(shards * routed_capacity(batch * per, -(-model.tables[t] // shards)) for t, per in calls)
        routing = 2 * 4 * slots * dim
    return DeviceBytes(tables=4 * rows * dim, accumulators=4 * rows, table_gradients=4 * rows * dim,
                       dense=16 * dense, lookups=2 * 4 * ids * dim, routing=routing)


def device_batch(global_batch: int, shards: int, routed: bool) -> int:
    """The samples whose ids one device handles: its share when routed, else the whole step's."""
    return global_batch // shards if routed else global_batch


def smallest_mesh(cfg: Config, global_batch: int, limit: int, routed: bool = False) -> int | None:
    """The fewest devices (a power of 2 up to 1024, dividing the batch when routed) whose row split keeps
    `per_device` within `limit`."""
    return next((n for n in MESHES if not (routed and global_batch % n)
                 and per_device(cfg, n, device_batch(global_batch, n, routed), routed).total <= limit), None)


def gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


def refusal(cfg: Config, shards: int, global_batch: int, limit: tuple[int, str], routed: bool = False) -> str | None:
    """One line refusing a layout whose lower bound exceeds the device's memory (None where it fits): the
    bound's parts, and the smallest mesh that fits, or why none does."""
    batch = device_batch(global_batch, shards, routed)
    b = per_device(cfg, shards, batch, routed)
    if b.total <= limit[0]:
        return None
    fits = smallest_mesh(cfg, global_batch, limit[0], routed)
    if fits is not None:
        need = per_device(cfg, fits, device_batch(global_batch, fits, routed), routed).total
        tail = f"the smallest mesh that fits splits the rows {fits} ways ({gib(need)})"
    elif routed:
        tail = "no split of the rows up to 1,024 devices fits"
    else:
        tail = (f"no split of the rows fits: the looked-up rows alone take {gib(b.lookups)}, and every device "
                f"looks up all {batch:,} samples' ids; a layout splitting the batch over the rows' devices "
                f"(runtime.layout batch on the vocab axis) routes each device's ids to their owners")
    handled = (f"its {batch:,}-sample share of the {global_batch:,}, routed to their owners (buffers "
               f"{gib(b.routing)})" if routed else f"the {batch:,} samples each device looks up")
    return (f"dlrmv4 needs at least {gib(b.total)} per device with its tables' rows split {shards} ways: tables "
            f"{gib(b.tables)}, their gradients {gib(b.table_gradients)}, optimizer state {gib(b.optimizer_state)} "
            f"(row-wise Adagrad {gib(b.accumulators)}, Adam {gib(b.dense // 2)}), dense weights and gradients "
            f"{gib(b.dense // 2)}, looked-up rows and their gradients {gib(b.lookups)} for {handled} (dense "
            f"activations not counted), but one {limit[1]} holds {gib(limit[0])}; {tail}")
