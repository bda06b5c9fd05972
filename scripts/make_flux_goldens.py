"""Golden outputs of the reference MMDiT for flux1: diffusers' `FluxTransformer2DModel` (FLUX.1-schnell's
architecture, guidance_embeds=False) at a tiny size that keeps every feature, with random weights, saved in
diffusers layout, and its prediction, rectified-flow loss and a few gradients at fixed inputs, noise and
timesteps, written to tests/data/flux_golden/ (tests/test_flux1_golden.py loads the checkpoint through the
harness's importer and compares).

Needs torch and diffusers, which the harness never depends on: run it with a separate environment, e.g.

    python3 -m venv ../hfref
    ../hfref/bin/pip install torch==2.13.0 diffusers==0.42.1 safetensors numpy
    OMP_NUM_THREADS=1 ../hfref/bin/python scripts/make_flux_goldens.py

(golden.json records the versions used). The tiny size: hidden 128 = 4 heads x 32, RoPE axes (8, 12, 12), 2
double and 2 single blocks, MLP ratio 4, text 8 tokens of 64 channels, pooled text 32, a 16 x 8 x 8 latent
packed into 16 tokens of 64 (a 4 x 4 grid of 2 x 2 patches). The weights are drawn at random (the modulation
too: the reference's adaLN-Zero init makes every block the identity) and rounded to bfloat16, in which they
are stored (half the bytes); everything is then computed in float32 on the CPU.

The objective, as the MLPerf reference's FluxTrainer.train_step (mlcommons/training@aa344c7f, torchtitan
9603aa83 torchtitan/experiments/flux/train.py): x_t = (1 - t) x0 + t noise, target noise - x0, loss = the mean
squared error over every latent element, t already rounded to bfloat16 (io.npz holds both the draws u and t).
Latents are packed as einops "b c (h ph) (w pw) -> b (h w) (c ph pw)" (torchtitan flux utils.pack_latents);
image position ids are (0, row, col), text ids 0, text first.
"""
from __future__ import annotations

import json
import os

import numpy as np
import torch

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data", "flux_golden")
TINY = dict(patch_size=1, in_channels=64, num_layers=2, num_single_layers=2, attention_head_dim=32,
            num_attention_heads=4, joint_attention_dim=64, pooled_projection_dim=32, guidance_embeds=False,
            axes_dims_rope=(8, 12, 12))
BATCH, TEXT, CHANNELS, SIZE = 2, 8, 16, 8
# gradients compared: small tensors from each part of the model (embedders, both block kinds, the final layer)
GRAD_NAMES = ("x_embedder.weight", "context_embedder.bias", "time_text_embed.timestep_embedder.linear_1.bias",
              "transformer_blocks.0.attn.to_q.weight", "transformer_blocks.1.norm1_context.linear.bias",
              "transformer_blocks.0.attn.norm_added_k.weight", "single_transformer_blocks.1.proj_mlp.bias",
              "single_transformer_blocks.0.attn.norm_k.weight", "norm_out.linear.bias", "proj_out.bias")


def pack(x: torch.Tensor) -> torch.Tensor:
    """[b, c, (h 2), (w 2)] -> [b, (h w), (c 2 2)]."""
    b, c, hh, ww = x.shape
    x = x.reshape(b, c, hh // 2, 2, ww // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (hh // 2) * (ww // 2), c * 4)


def main() -> None:
    import diffusers
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    model = FluxTransformer2DModel(**TINY)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm_q.weight") or name.endswith("norm_k.weight") or "norm_added" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.05 * torch.randn_like(p))
            else:
                fan_in = p.shape[1]
                p.copy_(torch.randn_like(p) * (1.5 / fan_in ** 0.5))
            p.copy_(p.to(torch.bfloat16).to(torch.float32))   # stored in bfloat16, exactly
    model.eval()

    gen = torch.Generator().manual_seed(1)
    x0 = torch.randn(BATCH, CHANNELS, SIZE, SIZE, generator=gen)
    noise = torch.randn(BATCH, CHANNELS, SIZE, SIZE, generator=gen)
    t5 = torch.randn(BATCH, TEXT, TINY["joint_attention_dim"], generator=gen)
    clip = torch.randn(BATCH, TINY["pooled_projection_dim"], generator=gen)
    u = torch.tensor([0.3, 0.85])                      # the uniform draws, not bfloat16 values
    t = u.to(torch.bfloat16).to(torch.float32)          # the reference rounds them (torch.rand(...).to(bf16))
    grid = SIZE // 2
    rows, cols = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
    img_ids = torch.stack([torch.zeros(grid * grid), rows.reshape(-1).float(), cols.reshape(-1).float()], 1)
    txt_ids = torch.zeros(TEXT, 3)

    x_t = (1 - t[:, None, None, None]) * x0 + t[:, None, None, None] * noise
    pred = model(hidden_states=pack(x_t), encoder_hidden_states=t5, pooled_projections=clip, timestep=t,
                 img_ids=img_ids, txt_ids=txt_ids, return_dict=False)[0]
    loss = torch.mean((pred.float() - pack(noise - x0).float()) ** 2)
    loss.backward()
    params = dict(model.named_parameters())
    grads = {f"grad:{n}": params[n].grad.numpy().copy() for n in GRAD_NAMES}

    os.makedirs(OUT, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(os.path.join(OUT, "transformer"), safe_serialization=True)
    np.savez(os.path.join(OUT, "io.npz"), x0=x0.numpy(), noise=noise.numpy(), t5=t5.numpy(), clip=clip.numpy(),
             u=u.numpy(), t=t.numpy(), pred=pred.detach().numpy(), loss=loss.detach().numpy(),
             **grads)
    with open(os.path.join(OUT, "golden.json"), "w") as f:
        json.dump({"torch": torch.__version__, "diffusers": diffusers.__version__, "config": TINY,
                   "batch": BATCH, "text_tokens": TEXT, "latent": [CHANNELS, SIZE, SIZE],
                   "loss": float(loss), "max_abs_pred": float(pred.abs().max()), "grads": list(GRAD_NAMES)},
                  f, indent=2)
        f.write("\n")
    print(f"wrote {OUT}: loss {float(loss):.6f}, max |pred| {float(pred.abs().max()):.3f}")


if __name__ == "__main__":
    main()
