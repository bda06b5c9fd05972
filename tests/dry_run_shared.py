"""Reduced-width dry runs of the hardware configs, built once per test session and shared by
tests/test_dry_run.py and tests/test_tpu_rules.py (each build and trace costs seconds)."""
from __future__ import annotations

import dataclasses
import glob
import json
import os

from harness import config as config_lib
from harness.dryrun import command
from harness.dryrun.report import CompileReport

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Per workload: the model's width and depth cut down (layout divisibility kept: 4 heads, ff and hidden
# divisible by a model axis of 4). SSD's closed rules demand the reference model, so it runs as open.
REDUCED = {
    "resnet": ["model.width=8", "model.blocks=[1,1,1,1]"],
    "bert": ["model.hidden_size=64", "model.num_layers=1", "model.num_heads=4", "model.ff_size=128"],
    "ssd": ["model.width=8", "model.blocks=[1,1,1]", "submission.division=open"],
    "transformer": ["model.hidden_size=64", "model.num_layers=1", "model.num_heads=4", "model.filter_size=128"],
    # Closed needs rows of 8192 tokens and the reference model: open, with short rows, 8 experts (one per
    # data replica of the reference's mesh) and 2 layers (one sliding-window, one full).
    "gpt_oss_20b": ["submission.division=open", "data.seq_length=512", "model.vocab_size=512",
                    "model.hidden_size=64", "model.num_layers=2", "model.num_heads=4", "model.num_kv_heads=2",
                    "model.head_dim=16", "model.num_experts=8", "model.experts_per_token=2",
                    "model.expert_hidden=64", "model.moe_group_size=256"],
    # Open with short rows (closed needs 8192 tokens and the reference model); 1 layer, FSDP as configured.
    "llama31_8b": ["submission.division=open", "data.seq_length=256", "model.vocab_size=512", "model.hidden_size=64",
                   "model.num_layers=1", "model.num_heads=4", "model.num_kv_heads=2", "model.head_dim=16",
                   "model.ffn_hidden=128"],
    # DeepSeek-V3 on its 256-device mesh (every device one expert per MoE layer) at width 256, so FSDP splits
    # every weight 256 ways; 1 dense and 1 MoE layer and MTP, rows of 64 tokens, 2 micro-batches of 1 row.
    # Open: closed needs rows of 4096 tokens, GBS >= 15360 and the checkpoint.
    "deepseekv3_671b": ["submission.division=open", "data.seq_length=64", "model.vocab_size=512",
                        "model.hidden_size=256", "model.num_layers=2", "model.first_dense_layers=1",
                        "model.num_heads=2", "model.num_kv_heads=2",
                        "model.q_lora_rank=256", "model.kv_lora_rank=256", "model.qk_nope_head_dim=8",
                        "model.qk_rope_head_dim=8", "model.v_head_dim=8", "model.ffn_hidden=64",
                        "model.expert_hidden=8", "schedule.global_batch_size=512",
                        "schedule.gradient_accumulation_steps=2"],
    # The same for the LoRA fine-tune: its frozen bf16 base and float32 adapters at width 64.
    "llama2_70b_lora": ["submission.division=open", "data.seq_length=256", "model.vocab_size=512",
                        "model.hidden_size=64", "model.num_layers=1", "model.num_heads=4", "model.num_kv_heads=2",
                        "model.head_dim=16", "model.ffn_hidden=128"],
    # flux1 at width 64 (4 heads of 16, RoPE (4, 6, 6)), one block of each kind, 16 text and 16 image tokens, open
    # (closed needs the reference model).
    "flux1": ["submission.division=open", "model.hidden_size=64", "model.num_heads=4", "model.axes_dim=[4, 6, 6]",
              "model.depth=1", "model.depth_single_blocks=1", "model.context_in_dim=64", "model.vec_in_dim=32",
              "data.text_tokens=16", "data.latent_size=8"],
    # dlrmv4 at width 16 (2 heads of 8), 1 STU layer, histories of 8 events, tables of 64-256 rows and the batch (2
    # samples a device) split over the 8 devices, ids routed to their owners, open (closed needs the reference
    # model and its Yambda cache).
    "dlrmv4": ["submission.division=open", "model.embedding_dim=16", "model.num_heads=2", "model.attention_dim=8",
               "model.linear_dim=8", "model.preprocessor_hidden_dim=16", "model.item_hidden_dim=16",
               "model.head_hidden_dim=16", "model.history_length=8", "model.max_seq_len=17",
               "model.num_position_buckets=32", "model.num_time_buckets=31", "schedule.global_batch_size=16",
               "model.num_layers=1", "optimizer.base_learning_rate=0.00000001",
               "model.tables={item_id: 256, artist_id: 64, album_id: 128, uid: 128, user_x_artist: 128, "
               "user_x_album: 128, user_x_hour: 128, item_x_hour: 128, artist_x_hour: 128, user_x_is_organic: 64, "
               "user_x_artist_x_hour: 128}"],
    # qwen35_397b_grpo on its 8 x 8 mesh with FSDP at width 64 (8 heads of 8, kv heads 8 so the model axis
    # splits them), one gated attention + MoE layer (a Gated DeltaNet layer doubles the compile), open on the toy
    # task (the reference's R2E-Gym tasks are refused: configs/qwen35_397b_grpo/reference.yaml's header).
    "qwen35_397b_grpo": ["submission.division=open", "data.source=synthetic", "data.data_dir=",
                         "model.init_checkpoint=", "model.vocab_size=32", "model.hidden_size=64", "model.num_layers=1",
                         "model.full_attention_interval=1", "model.num_heads=8", "model.num_kv_heads=8",
                         "model.head_dim=8", "model.rotary_dim=4", "model.num_experts=8", "model.experts_per_token=2",
                         "model.expert_hidden=16", "model.shared_expert_hidden=16", "grpo.max_new_tokens=1",
                         "grpo.max_trajectory_tokens=64", "schedule.global_batch_size=128"],
}

HARDWARE_CONFIGS = sorted(os.path.relpath(f, REPO) for pattern in ("reference", "gpu-*", "tpu-*")
                          for f in glob.glob(os.path.join(REPO, "configs", "*", f"{pattern}.yaml")))


def workload_of(config: str) -> str:
    return config.split(os.sep)[1]


def program_key(config: str) -> str:
    """What a reduced compile depends on: the config as resolved with its REDUCED overrides, less the names of
    the system it is booked on (submission org, platform, status: the report never reads them). Configs that
    differ only there (flux1's reference.yaml and gpu-8x-h200.yaml) share one compile."""
    cfg = config_lib.load_config(os.path.join(REPO, config), REDUCED[workload_of(config)])
    resolved = dataclasses.asdict(cfg)
    resolved["submission"] = {"division": cfg.submission.division}
    return json.dumps(resolved, sort_keys=True, default=str)


_by_program: dict[tuple[str, bool], CompileReport] = {}


def reduced_report(config: str, optimize: bool = False) -> CompileReport:
    """The reduced-width dry run of a hardware config, compiled once per program (`program_key`)."""
    path = os.path.join(REPO, config)
    key = (program_key(config), optimize)
    if key not in _by_program:
        _by_program[key] = command.compile_report(path, REDUCED[workload_of(config)], optimize=optimize)
    return dataclasses.replace(_by_program[key], config=path)
