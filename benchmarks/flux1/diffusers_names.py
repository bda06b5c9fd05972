"""The MMDiT in diffusers' layout (`FluxTransformer2DModel.save_pretrained`: config.json and
diffusion_pytorch_model.safetensors), which harness/nn/hf_checkpoint.py reads and writes, so a harness-trained
model samples with diffusers and a diffusers checkpoint starts a harness run.

The names follow diffusers' own converter from the black-forest-labs (= torchtitan) layout
(huggingface/diffusers@58eb52c0:scripts/convert_flux_to_diffusers.py):
- the fused qkv of each stream splits into to_q/to_k/to_v (text stream: add_q_proj/add_k_proj/add_v_proj), each
  torch Linear [heads x head_dim, hidden]; the harness holds it as one kernel [hidden, 3, heads, head_dim];
- the single block's linear1 splits into to_q/to_k/to_v and proj_mlp; its linear2 is proj_out [hidden, hidden +
  mlp] (columns: attention, then MLP), held as out_attn [heads, head_dim, hidden] and out_mlp [mlp, hidden];
- the final layer's adaLN modulation is norm_out.linear with its two halves SWAPPED: diffusers'
  AdaLayerNormContinuous chunks (scale, shift), the reference (shift, scale).
diffusers fixes what the harness's config leaves open: MLP ratio 4, RoPE base 10000, q/k/v biases, norm epsilon
1e-6; a config that differs is refused in one line.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from harness.nn.hf_checkpoint import Checker, Entry, Format, Layout, Out, Part

CLASS_NAME = "FluxTransformer2DModel"
DIFFUSERS_VERSION = "0.42.1"  # the version whose layout this is (the golden files were made with it)
STEM = "diffusion_pytorch_model"
FIXED = {"mlp_ratio": 4.0, "theta": 10000.0, "qkv_bias": True, "norm_epsilon": 1e-6}


def _linear(path: str, name: str, n_in: int, n_out: int) -> tuple[list[Entry], list[Out]]:
    """A torch Linear `name` [out, in] (+ bias) <-> kernel [in, out] and bias at `path`."""
    w, b = Part(f"{name}.weight", (n_out, n_in)), Part(f"{name}.bias", (n_out,))
    entries = [Entry(f"{path}/kernel", (n_in, n_out), (w,), lambda a: np.ascontiguousarray(a.T)),
               Entry(f"{path}/bias", (n_out,), (b,), lambda a: np.asarray(a))]
    outs = [Out(w.name, w.shape, (f"{path}/kernel",), lambda k: np.ascontiguousarray(k.T)),
            Out(b.name, b.shape, (f"{path}/bias",), lambda a: np.asarray(a))]
    return entries, outs


def _qkv(path: str, prefix: str, names: tuple[str, str, str], m: int, h: int, d: int) -> tuple[list, list]:
    """Three torch Linears (q, k, v) <-> kernel [hidden, 3, heads, head_dim] and bias [3, heads, head_dim]."""
    ws = tuple(Part(f"{prefix}.{n}.weight", (h * d, m)) for n in names)
    bs = tuple(Part(f"{prefix}.{n}.bias", (h * d,)) for n in names)
    kernel, bias = f"{path}/qkv/kernel", f"{path}/qkv/bias"
    entries = [Entry(kernel, (m, 3, h, d), ws, lambda *a: np.stack([x.T for x in a], 1).reshape(m, 3, h, d)),
               Entry(bias, (3, h, d), bs, lambda *a: np.stack(a, 0).reshape(3, h, d))]
    outs = [Out(w.name, w.shape, (kernel,), lambda k, j=j: np.ascontiguousarray(k.reshape(m, 3, h * d)[:, j].T))
            for j, w in enumerate(ws)]
    outs += [Out(b.name, b.shape, (bias,), lambda a, j=j: np.asarray(a).reshape(3, h * d)[j]) for j, b in enumerate(bs)]
    return entries, outs


def _vector(path: str, name: str, n: int) -> tuple[list, list]:
    part = Part(name, (n,))
    return ([Entry(path, (n,), (part,), lambda a: np.asarray(a))],
            [Out(name, (n,), (path,), lambda a: np.asarray(a))])


def layout(m: Any, names: set[str] | None = None, have: Any = None, root: str = "flux") -> Layout:
    """Every variable of benchmarks/flux1/model.py's `Flux` (under `root`) and its diffusers tensors."""
    hid, h, d, f = m.hidden_size, m.num_heads, m.head_dim, m.mlp_hidden
    entries: list[Entry] = []
    outs: list[Out] = []

    def add(pair: tuple[list, list]) -> None:
        entries.extend(pair[0])
        outs.extend(pair[1])

    add(_linear(f"{root}/img_in", "x_embedder", m.in_channels, hid))
    add(_linear(f"{root}/txt_in", "context_embedder", m.context_in_dim, hid))
    add(_linear(f"{root}/time_in/in_layer", "time_text_embed.timestep_embedder.linear_1", 256, hid))
    add(_linear(f"{root}/time_in/out_layer", "time_text_embed.timestep_embedder.linear_2", hid, hid))
    add(_linear(f"{root}/vector_in/in_layer", "time_text_embed.text_embedder.linear_1", m.vec_in_dim, hid))
    add(_linear(f"{root}/vector_in/out_layer", "time_text_embed.text_embedder.linear_2", hid, hid))
    for i in range(m.depth):
        blk, t = f"{root}/double_{i}", f"transformer_blocks.{i}"
        for stream, norm1, qkv, norms, proj, ff in (
                ("img", "norm1", ("to_q", "to_k", "to_v"), ("norm_q", "norm_k"), "attn.to_out.0", "ff"),
                ("txt", "norm1_context", ("add_q_proj", "add_k_proj", "add_v_proj"), ("norm_added_q", "norm_added_k"),
                 "attn.to_add_out", "ff_context")):
            s = f"{blk}/{stream}"
            add(_linear(f"{s}/mod/lin", f"{t}.{norm1}.linear", hid, 6 * hid))
            add(_qkv(f"{s}/attn", f"{t}.attn", qkv, hid, h, d))
            add(_vector(f"{s}/attn/query_norm/gamma", f"{t}.attn.{norms[0]}.weight", d))
            add(_vector(f"{s}/attn/key_norm/gamma", f"{t}.attn.{norms[1]}.weight", d))
            pe, po = _linear(f"{s}/attn/proj", f"{t}.{proj}", hid, hid)
            # the harness's output kernel is [heads, head_dim, hidden]
            kernel = f"{s}/attn/proj/kernel"
            pe[0] = Entry(kernel, (h, d, hid), pe[0].parts, lambda a: np.ascontiguousarray(a.T).reshape(h, d, hid))
            po[0] = Out(po[0].name, po[0].shape, (kernel,), lambda k: np.ascontiguousarray(k.reshape(h * d, hid).T))
            add((pe, po))
            add(_linear(f"{s}/mlp/in", f"{t}.{ff}.net.0.proj", hid, f))
            add(_linear(f"{s}/mlp/out", f"{t}.{ff}.net.2", f, hid))
    for i in range(m.depth_single_blocks):
        s, t = f"{root}/single_{i}", f"single_transformer_blocks.{i}"
        add(_linear(f"{s}/mod/lin", f"{t}.norm.linear", hid, 3 * hid))
        add(_qkv(f"{s}/attn", f"{t}.attn", ("to_q", "to_k", "to_v"), hid, h, d))
        add(_vector(f"{s}/attn/query_norm/gamma", f"{t}.attn.norm_q.weight", d))
        add(_vector(f"{s}/attn/key_norm/gamma", f"{t}.attn.norm_k.weight", d))
        add(_linear(f"{s}/mlp_in", f"{t}.proj_mlp", hid, f))
        w, b = Part(f"{t}.proj_out.weight", (hid, hid + f)), Part(f"{t}.proj_out.bias", (hid,))
        a_k, m_k, m_b = f"{s}/out_attn/kernel", f"{s}/out_mlp/kernel", f"{s}/out_mlp/bias"
        entries += [Entry(a_k, (h, d, hid), (w,), lambda a: np.ascontiguousarray(a[:, :hid].T).reshape(h, d, hid)),
                    Entry(m_k, (f, hid), (w,), lambda a: np.ascontiguousarray(a[:, hid:].T)),
                    Entry(m_b, (hid,), (b,), lambda a: np.asarray(a))]
        outs += [Out(w.name, w.shape, (a_k, m_k),
                     lambda ka, km: np.ascontiguousarray(np.concatenate([ka.reshape(h * d, hid), km], 0).T)),
                 Out(b.name, b.shape, (m_b,), lambda a: np.asarray(a))]
    # the final layer: diffusers holds (scale, shift), the reference (shift, scale)
    fl = f"{root}/final_layer"
    w, b = Part("norm_out.linear.weight", (2 * hid, hid)), Part("norm_out.linear.bias", (2 * hid,))

    def swap(a: np.ndarray) -> np.ndarray:
        return np.concatenate([a[hid:], a[:hid]], 0)

    entries += [Entry(f"{fl}/adaLN/lin/kernel", (hid, 2 * hid), (w,), lambda a: np.ascontiguousarray(swap(a).T)),
                Entry(f"{fl}/adaLN/lin/bias", (2 * hid,), (b,), swap)]
    outs += [Out(w.name, w.shape, (f"{fl}/adaLN/lin/kernel",), lambda k: swap(np.ascontiguousarray(k.T))),
             Out(b.name, b.shape, (f"{fl}/adaLN/lin/bias",), lambda a: swap(np.asarray(a)))]
    add(_linear(f"{fl}/linear", "proj_out", hid, m.in_channels))
    return Layout(entries, outs)


def config_problems(hf: dict[str, Any], m: Any) -> list[str]:
    """Where a diffusers config.json differs from the model config (one entry each)."""
    c = Checker(hf)
    c.flag("_class_name", None, CLASS_NAME, f"not a {CLASS_NAME}")
    c.same("num_layers", m.depth, "model.depth")
    c.same("num_single_layers", m.depth_single_blocks, "model.depth_single_blocks")
    c.same("num_attention_heads", m.num_heads, "model.num_heads")
    c.same("attention_head_dim", m.head_dim, "model.hidden_size / model.num_heads")
    c.same("in_channels", m.in_channels, "model.in_channels")
    c.same("joint_attention_dim", m.context_in_dim, "model.context_in_dim")
    c.same("pooled_projection_dim", m.vec_in_dim, "model.vec_in_dim")
    c.same("patch_size", 1, "a packed latent token", default=1)
    c.flag("guidance_embeds", False, False, "the model has no guidance embedding (FLUX.1-schnell's)")
    if list(hf.get("axes_dims_rope", [])) != list(m.axes_dim):
        c.problems.append(f"config.json axes_dims_rope={hf.get('axes_dims_rope')}, the model has model.axes_dim="
                          f"{list(m.axes_dim)}")
    if hf.get("out_channels") not in (None, m.in_channels):
        c.problems.append(f"config.json out_channels={hf.get('out_channels')}, the model predicts model.in_channels="
                          f"{m.in_channels}")
    for key, want in FIXED.items():
        if getattr(m, key) != want:
            c.problems.append(f"diffusers' FluxTransformer2DModel fixes {key} at {want}, the model has model.{key}="
                              f"{getattr(m, key)}")
    return c.problems


def config(cfg: Any, dtype: str) -> dict[str, Any]:
    """config.json as FluxTransformer2DModel.save_pretrained writes it."""
    m = cfg.model
    return {"_class_name": CLASS_NAME, "_diffusers_version": DIFFUSERS_VERSION, "attention_head_dim": m.head_dim,
            "axes_dims_rope": list(m.axes_dim), "guidance_embeds": False, "in_channels": m.in_channels,
            "joint_attention_dim": m.context_in_dim, "num_attention_heads": m.num_heads, "num_layers": m.depth,
            "num_single_layers": m.depth_single_blocks, "out_channels": None, "patch_size": 1,
            "pooled_projection_dim": m.vec_in_dim}


FORMAT = Format(layout, config_problems, config, stem=STEM)
