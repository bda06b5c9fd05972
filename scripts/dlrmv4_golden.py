"""Writes tests/data/dlrmv4_golden/*.npz: the MLPerf dlrmv4 reference's own PyTorch modules at a tiny size.

Run in the side virtualenv (torch, scikit-learn), never by the harness:
    OMP_NUM_THREADS=1 python scripts/dlrmv4_golden.py --reference_dir DIR
DIR is `recommendation_v4/` of mlcommons/training at a67b8459467c551c08f8566d68a8e4e1659e6bd7 (the head of
PR #889), e.g. `git archive a67b8459 recommendation_v4 | tar -x`.

What runs as the reference ships it (HammerKernel.PYTORCH, CPU, float32 because `torch.autocast("cuda")` is
inert on the CPU): the user path, i.e. modules/hstu_transducer.py HSTUTransducer over
modules/preprocessors.py ContextualPreprocessor (with modules/action_encoder.py), modules/positional_encoder.py
HSTUPositionalEncoder, modules/stu.py STUStack of STULayer, modules/postprocessors.py
TimestampLayerNormPostprocessor; and ops/layer_norm.py LayerNorm / SwishLayerNorm in the item MLP and head.

What is written out here instead, because torchrec and fbgemm_gpu (1.9.0, built for an older torch) do not
load beside torch 2.13 on this machine:
- torch.ops.fbgemm's jagged_to_padded_dense, dense_to_jagged and asynchronous_complete_cumsum, as plain
  torch (pure data movement, registered under the same names so the reference modules call them);
- the EmbeddingCollection lookups, as plain row gathers from the 11 tables;
- modules/dlrm_hstu.py's glue (merging history and candidate, the item MLP and dot-product head of
  multitask_module.py, loss 0.2 x mean BCE), copied in structure from that file;
- FBGEMM's EXACT_ROWWISE_ADAGRAD (pytorch/FBGEMM@00c10a03 fbgemm_gpu/codegen/genscript/optimizers.py
  `rowwise_adagrad`): G_r += mean(g_r^2), w_r -= lr g_r / (sqrt(G_r) + eps) on the rows a step touched.
The dense optimizer is torch.optim.Adam itself, after torch.nn.utils.clip_grad_norm_ of the dense grads.

The batch is 16 samples dealt as two replicas of 8 (each replica divides its attention by its own longest
sequence); the loss of the step is 0.2 x the mean BCE over all 16 (what the harness computes; the reference's
sum of sparse gradients over ranks differs only through Adagrad's eps). Time buckets: the tiny table has
num_time_buckets + 1 = 32 rows and D = 32, so the PyTorch path's clamp (`ts_embeddings.size(1) - 1`) and the
Triton path's (`ts_emb_size - 1`, the one the reference trains with) are the same bucket, 31.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "tests", "data", "dlrmv4_golden")

TABLES = {"item_id": 1000, "artist_id": 100, "album_id": 300, "uid": 51, "user_x_artist": 97,
          "user_x_album": 89, "user_x_hour": 83, "item_x_hour": 79, "artist_x_hour": 73,
          "user_x_is_organic": 5, "user_x_artist_x_hour": 71}
CONTEXT = list(TABLES)[3:]
D, HEADS, QK, UV, HIDDEN, HISTORY = 32, 2, 16, 16, 16, 30
POSITION_BUCKETS, TIME_BUCKETS = 32, 31
REPLICAS, PER_REPLICA = 2, 8
LR = 0.01


def make_batch(seed: int = 0) -> dict[str, np.ndarray]:
    """16 samples: jagged histories (lengths 12..30), timestamps spread so time buckets run 0..31 and clamp."""
    rng = np.random.default_rng(seed)
    b = REPLICAS * PER_REPLICA
    n = rng.integers(12, HISTORY + 1, b)
    n[:PER_REPLICA] = np.minimum(n[:PER_REPLICA], 20)  # replica 0's longest is shorter than replica 1's
    n[PER_REPLICA] = HISTORY
    mask = np.arange(HISTORY)[None, :] < n[:, None]
    out = {"uih_length": n.astype(np.int64)}
    for name in ("item_id", "artist_id", "album_id"):
        out[f"uih_{name}"] = np.where(mask, rng.integers(1, TABLES[name], (b, HISTORY)), 0).astype(np.int64)
        out[f"cand_{name}"] = rng.integers(1, TABLES[name], b).astype(np.int64)
    out["uih_item_id"][:, :3] = 7  # duplicate rows within and across samples (dedup, summed gradients)
    gaps = rng.integers(5, 4000, (b, HISTORY))
    ts = 1_700_000_000 + np.cumsum(gaps, axis=1)
    out["uih_timestamp"] = np.where(mask, ts, 0).astype(np.int64)
    out["uih_action"] = np.where(mask, rng.integers(0, 8, (b, HISTORY)), 0).astype(np.int64)
    out["context_ids"] = np.stack([rng.integers(0, TABLES[t], b) for t in CONTEXT], 1).astype(np.int64)
    out["label"] = rng.integers(0, 2, b).astype(np.int64)
    return out


def register_fbgemm_ops(torch) -> None:
    """The three torch.ops.fbgemm jagged ops the reference's PyTorch path calls, as plain torch."""
    lib = torch.library.Library("fbgemm", "DEF")
    lib.define("jagged_to_padded_dense(Tensor values, Tensor[] offsets, SymInt[] max_lengths, "
               "float padding_value=0) -> Tensor")
    lib.define("dense_to_jagged(Tensor dense, Tensor[] x_offsets, SymInt? total_L=None) -> (Tensor, Tensor[])")
    lib.define("asynchronous_complete_cumsum(Tensor t_in) -> Tensor")

    def to_padded(values, offsets, max_lengths, padding_value=0.0):
        off = offsets[0]
        rows = []
        for i in range(off.numel() - 1):
            seg = values[int(off[i]):int(off[i + 1])][:max_lengths[0]]
            pad = values.new_full((max_lengths[0] - seg.shape[0],) + tuple(values.shape[1:]), padding_value)
            rows.append(torch.cat([seg, pad], 0))
        return torch.stack(rows, 0)

    def to_jagged(dense, x_offsets, total_L=None):
        off = x_offsets[0]
        parts = [dense[i, :int(off[i + 1] - off[i])] for i in range(off.numel() - 1)]
        return torch.cat(parts, 0), [off]

    def cumsum(t):
        return torch.cat([t.new_zeros(1), torch.cumsum(t, 0)])

    lib.impl("jagged_to_padded_dense", to_padded, "CompositeImplicitAutograd")
    lib.impl("dense_to_jagged", to_jagged, "CompositeImplicitAutograd")
    lib.impl("asynchronous_complete_cumsum", cumsum, "CompositeImplicitAutograd")
    register_fbgemm_ops.lib = lib  # keep the library alive


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference_dir", required=True, help="recommendation_v4/ of mlcommons/training@a67b8459")
    args = parser.parse_args()
    sys.path.insert(0, os.path.abspath(args.reference_dir))
    import torch
    register_fbgemm_ops(torch)
    from generative_recommenders.common import HammerKernel
    from generative_recommenders.modules.hstu_transducer import HSTUTransducer
    from generative_recommenders.modules.positional_encoder import HSTUPositionalEncoder
    from generative_recommenders.modules.postprocessors import TimestampLayerNormPostprocessor
    from generative_recommenders.modules.preprocessors import ContextualPreprocessor
    from generative_recommenders.modules.stu import STULayer, STULayerConfig, STUStack
    from generative_recommenders.ops.layer_norm import LayerNorm, SwishLayerNorm
    from sklearn.metrics import roc_auc_score

    torch.manual_seed(0)
    preprocessor = ContextualPreprocessor(
        input_embedding_dim=D, hidden_dim=HIDDEN, output_embedding_dim=D,
        contextual_feature_to_max_length={t: 1 for t in CONTEXT},
        contextual_feature_to_min_uih_length={t: 0 for t in CONTEXT}, action_embedding_dim=8,
        action_feature_name="action_weight", action_weights=[1, 2, 4], action_embedding_init_std=0.1,
        additional_embedding_features=["artist_id", "album_id"], is_inference=False)
    positional = HSTUPositionalEncoder(num_position_buckets=POSITION_BUCKETS, num_time_buckets=TIME_BUCKETS,
                                       embedding_dim=D, contextual_seq_len=len(CONTEXT), is_inference=False)
    postprocessor = TimestampLayerNormPostprocessor(embedding_dim=D, time_duration_features=[(3600, 24), (86400, 7)],
                                                    eps=1e-5, is_inference=False)
    stu = STUStack(stu_list=[STULayer(config=STULayerConfig(
        embedding_dim=D, num_heads=HEADS, hidden_dim=UV, attention_dim=QK, output_dropout_ratio=0.0,
        use_group_norm=False, causal=True, target_aware=True, max_attn_len=None, attn_alpha=None,
        contextual_seq_len=0), is_inference=False) for _ in range(3)], is_inference=False)
    transducer = HSTUTransducer(stu_module=stu, input_preprocessor=preprocessor, output_postprocessor=postprocessor,
                                input_dropout_ratio=0.0, positional_encoder=positional, is_inference=False,
                                return_full_embeddings=False, listwise=False)
    transducer.recursive_setattr("_hammer_kernel", HammerKernel.PYTORCH)
    item_mlp = torch.nn.Sequential(torch.nn.Linear(3 * D, 512), SwishLayerNorm(512), torch.nn.Linear(512, D),
                                   LayerNorm(D))
    head = torch.nn.Sequential(torch.nn.Linear(D, 512), SwishLayerNorm(512), torch.nn.Linear(512, 1))
    for mod in (item_mlp, head):  # common.py init_mlp_weights_optional_bias; the PyTorch kernels on the CPU
        for m in mod.modules():
            if hasattr(m, "_hammer_kernel"):
                m._hammer_kernel = HammerKernel.PYTORCH
            if isinstance(m, torch.nn.Linear):
                torch.nn.init.xavier_uniform_(m.weight)
                torch.nn.init.zeros_(m.bias)
    tables = {name: torch.nn.Parameter(torch.empty(rows, D).uniform_(-rows ** -0.5, rows ** -0.5))
              for name, rows in TABLES.items()}
    with torch.no_grad():  # non-trivial norm parameters, so a swapped gamma/beta shows
        for name, p in list(transducer.named_parameters()) + list(item_mlp.named_parameters()) + \
                list(head.named_parameters()):
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))

    batch = make_batch()

    def forward(rows: slice):
        """dlrm_hstu.py main_forward for one replica's samples: merge history and candidate per feature."""
        n = torch.tensor(batch["uih_length"][rows])
        b = n.numel()
        cat = lambda a, c: torch.cat([torch.cat([a[i, :n[i]], c[i:i + 1]]) for i in range(b)])  # noqa: E731
        look = {}
        for name in ("item_id", "artist_id", "album_id"):
            ids = cat(torch.tensor(batch[f"uih_{name}"][rows]), torch.tensor(batch[f"cand_{name}"][rows]))
            look[name] = tables[name][ids]
        ts_h = torch.tensor(batch["uih_timestamp"][rows])
        query = ts_h[torch.arange(b), n - 1]
        timestamps = cat(ts_h, query)
        actions = torch.cat([torch.tensor(batch["uih_action"][rows])[i, :n[i]] for i in range(b)])
        ctx = torch.tensor(batch["context_ids"][rows])
        payload = {"action_weight": actions, "artist_id": look["artist_id"], "album_id": look["album_id"]}
        for k, name in enumerate(CONTEXT):
            payload[name] = tables[name][ctx[:, k]]
            payload[name + "_offsets"] = torch.arange(b + 1)
        user, _ = transducer(max_uih_len=int(n.max()), max_targets=1, total_uih_len=int(n.sum()), total_targets=b,
                             seq_lengths=n + 1, seq_embeddings=look["item_id"], seq_timestamps=timestamps,
                             num_targets=torch.ones(b, dtype=torch.int64), seq_payloads=payload)
        cand = torch.cat([tables[t][torch.tensor(batch[f"cand_{t}"][rows])] for t in ("item_id", "artist_id",
                                                                                       "album_id")], -1)
        return head(user * item_mlp(cand)).squeeze(-1)

    def all_logits():
        return torch.cat([forward(slice(r * PER_REPLICA, (r + 1) * PER_REPLICA)) for r in range(REPLICAS)])

    names = {}
    for name, p in transducer.named_parameters():
        names["transducer." + name] = p
    for name, p in item_mlp.named_parameters():
        names["item_mlp." + name] = p
    for name, p in head.named_parameters():
        names["head." + name] = p
    before = {k: v.detach().numpy().copy() for k, v in names.items()}
    before.update({f"table.{k}": v.detach().numpy().copy() for k, v in tables.items()})

    logits = all_logits()
    labels = torch.tensor(batch["label"], dtype=torch.float32)
    loss = 0.2 * torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
    loss.backward()
    dense = list(names.values())
    torch.nn.utils.clip_grad_norm_(dense, max_norm=1.0)
    adam = torch.optim.Adam(dense, lr=LR, betas=(0.95, 0.999), eps=1e-8, weight_decay=0.0)
    adam.step()
    with torch.no_grad():
        acc = {}
        for name, t in tables.items():  # FBGEMM EXACT_ROWWISE_ADAGRAD on the rows the step touched
            g = t.grad
            touched = (g != 0).any(dim=1)
            acc[name] = torch.where(touched, (g * g).mean(dim=1), torch.zeros(g.shape[0]))
            t -= LR * g / (acc[name].sqrt()[:, None] + 1e-8)
    after = {k: v.detach().numpy().copy() for k, v in names.items()}
    after.update({f"table.{k}": v.detach().numpy().copy() for k, v in tables.items()})
    after.update({f"accumulator.{k}": v.numpy() for k, v in acc.items()})

    # AUC: sklearn's Mann-Whitney statistic with ties counted a half, on scores with many ties.
    rng = np.random.default_rng(1)
    auc_scores = np.round(rng.random(2000), 2).astype(np.float32)
    auc_labels = (rng.random(2000) < 0.3 + 0.4 * auc_scores).astype(np.int64)

    os.makedirs(OUT, exist_ok=True)
    np.savez_compressed(os.path.join(OUT, "batch.npz"), **batch)
    np.savez_compressed(os.path.join(OUT, "weights_before.npz"), **before)
    np.savez_compressed(os.path.join(OUT, "weights_after.npz"), **after)
    np.savez_compressed(os.path.join(OUT, "outputs.npz"), logits=logits.detach().numpy(), loss=loss.detach().numpy(),
                        lr=np.float32(LR), auc_scores=auc_scores, auc_labels=auc_labels,
                        auc=np.float64(roc_auc_score(auc_labels, auc_scores)))
    print("wrote", OUT, "loss", float(loss), "logits", logits.detach().numpy()[:4])
    for k, v in before.items():
        print(k, v.shape)


if __name__ == "__main__":
    main()
