"""flux1's config sections. Defaults: the MLPerf reference, torchtitan's FLUX.1-schnell (no guidance embedding)
on precomputed CC12M embeddings (mlcommons/training@aa344c7f:text_to_image/README.md; its torchtitan submodule
at 9603aa83: torchtitan/experiments/flux/__init__.py `flux_configs["flux-schnell"]` and
train_configs/flux_schnell_mlperf_preprocessed.toml)."""
from __future__ import annotations

import dataclasses

from harness.config import field
from harness.errors import HarnessError
from harness.train.input_pipeline import PipelineConfig


@dataclasses.dataclass
class ModelConfig:
    """The MMDiT's sizes (torchtitan FluxModelArgs). The head size is hidden_size / num_heads and must equal
    sum(axes_dim): each RoPE axis turns its own slice of every head."""
    hidden_size: int = field(3072, min=2)
    num_heads: int = field(24, min=1)
    depth: int = field(19, min=0, doc="double-stream blocks (image and text streams, joint attention)")
    depth_single_blocks: int = field(38, min=0, doc="single-stream blocks over [text, image]")
    mlp_ratio: float = field(4.0, min=0.0, doc="MLP hidden units = hidden_size x mlp_ratio (GELU, tanh form)")
    axes_dim: list[int] = field(default_factory=lambda: [16, 56, 56],
                                doc="RoPE dims per position axis (0, row, col); adjacent pairs turn")
    theta: float = field(10000.0, min=1.0, doc="RoPE base")
    in_channels: int = field(64, min=1, doc="latent channels x 2 x 2 (a packed 2x2 patch per token)")
    vec_in_dim: int = field(768, min=1, doc="pooled CLIP-L text embedding")
    context_in_dim: int = field(4096, min=1, doc="T5-XXL hidden size")
    qkv_bias: bool = field(True)
    norm_epsilon: float = field(1e-6, min=0.0, doc="the LayerNorms (no affine) and the q/k RMSNorms")
    init_checkpoint: str = field("", doc="a diffusers FluxTransformer2DModel folder (config.json, "
                                 "diffusion_pytorch_model.safetensors) loaded after the model is built (open division)")
    remat: bool = field(False, doc="recompute each block in the backward pass (the reference's full activation "
                        "checkpointing): only each block's inputs are kept")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def mlp_hidden(self) -> int:
        return int(self.hidden_size * self.mlp_ratio)

    def validate(self) -> None:
        if self.hidden_size % self.num_heads:
            raise HarnessError(f"model.hidden_size={self.hidden_size} is not a multiple of model.num_heads="
                               f"{self.num_heads}")
        if len(self.axes_dim) != 3 or any(d <= 0 or d % 2 for d in self.axes_dim):
            raise HarnessError(f"model.axes_dim={self.axes_dim}: three positive even sizes (axes 0, row, col)")
        if sum(self.axes_dim) != self.head_dim:
            raise HarnessError(f"model.axes_dim={self.axes_dim} sums to {sum(self.axes_dim)}, not the head size "
                               f"{self.head_dim} (hidden_size / num_heads)")


@dataclasses.dataclass
class DataConfig(PipelineConfig):
    source: str = field("synthetic", choices=("synthetic", "embeddings"))
    deterministic: bool = field(True, doc="keep the stored row order through the pipeline: the reference reads "
                                "each replica's chunk in order, unshuffled (false lets a ready element overtake)")
    data_dir: str = field("", doc="embeddings: folder holding the three downloads below")
    train_pattern: str = field("cc12m_preprocessed/*.arrow", doc="embeddings: the training set's Arrow shards "
                               "(Hugging Face datasets save_to_disk), read in name order")
    eval_pattern: str = field("coco_preprocessed/*.arrow", doc="embeddings: the validation set's Arrow shards")
    empty_dir: str = field("empty_encodings", doc="embeddings: t5_empty.npy and clip_empty.npy (the empty "
                           "prompt's encodings, swapped in for classifier-free-guidance dropout)")
    train_samples: int = field(0, min=0, doc="samples in one epoch (MLPerf train_samples; closed 1,099,776); "
                               "0 = counted from the files, or synthetic_train_samples")
    eval_samples: int = field(29696, min=1, doc="validation samples (closed: 29,696)")
    text_tokens: int = field(256, min=1, doc="T5 tokens per caption")
    latent_channels: int = field(16, min=1, doc="VAE latent channels")
    latent_size: int = field(32, min=2, doc="VAE latent height = width (256 px / 8)")
    autoencoder_shift: float = field(0.1159, doc="x0 = (z - shift) * scale")
    autoencoder_scale: float = field(0.3611)
    cfg_dropout: float = field(0.1, min=0.0, max=1.0, doc="training: probability a sample's text is the empty "
                               "prompt's (validation: never)")
    eval_timesteps: int = field(8, min=1, doc="validation t = k / eval_timesteps for each sample's stored k")
    eval_every_samples: int = field(0, min=0, doc="eval cadence in training samples (0 = the rules: 262,144, "
                                    "or ceil(262144 / gbs) * gbs where gbs does not divide it)")
    synthetic_train_samples: int = field(1024, min=1, doc="synthetic: samples in one epoch")
    synthetic_seed: int = field(0, doc="synthetic: fixes the synthetic task")
    synthetic_classes: int = field(8, min=1, doc="synthetic: captions; each sample's latent mean is its "
                                   "caption's fixed pattern, so the velocity is learnable from the text")


@dataclasses.dataclass
class OptimizerConfig:
    """AdamW with one parameter group (weight decay on every parameter, as torchtitan's build_optimizers), a
    linear warmup to the base rate and then a constant rate (torchtitan LambdaLR with decay_ratio 0)."""
    base_learning_rate: float = field(2e-4, min=0.0)
    warmup_steps: int = field(1600, min=0, doc="update k (from 1) runs at base x min(k / warmup_steps, 1)")
    beta_1: float = field(0.9, min=0.0, max=1.0)
    beta_2: float = field(0.95, min=0.0, max=1.0)
    epsilon: float = field(1e-8, min=0.0)
    weight_decay: float = field(0.1, min=0.0)
    clip_norm: float = field(1.0, min=0.0, doc="clip gradients by global norm (0 = off)")
