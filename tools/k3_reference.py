#!/usr/bin/env python3
"""PyTorch reference for the text model of Kimi K3 (fp32, one no-cache pass): the golden model of docs/k3.md.

What: `load_k3(dir)` reads a K3 checkpoint directory (config.json with model_type "kimi_k3" and the text model in
`text_config`, model.safetensors with the `language_model.` prefix and MXFP4 routed experts) and returns a
`K3ForCausalLM` whose `forward(ids) -> logits [T, vocab]` runs the whole sequence in fp32; `greedy()` continues a
prompt by repeated full forwards. It also reads a plain Kimi Linear checkpoint (model_type "kimi_linear", no
prefix): then every K3 feature is off and the math is transformers' KimiLinearForCausalLM
(tools/test_k3_reference.py checks that).

Why: no transformers release on PyPI implements K3 (docs/k3.md "Reference"; transformers 5.24 has `kimi_linear`
but no `kimi_k3`). So this file reuses transformers' `kimi_linear` building blocks wherever the math is shared
(KimiLinearRMSNorm, KimiLinearRMSNormGated, causal_conv1d_fn, chunk_kimi_delta_attention with its l2norm,
KimiLinearTopkRouter, KimiLinearAttention's projections / expand_kv with eager_attention_forward, KimiLinearMLP)
and writes only the K3 deltas, each from the formula in docs/k3.md and the project's MODEL.md, cited inline:
bounded KDA forget gate, full-rank KDA output gate, MLA output gate, SiTU, latent MoE, AttnRes, MXFP4.

Numerics: every weight is cast to fp32 at load (bf16 and MXFP4 values are exact in fp32) and everything runs in
fp32 on plain PyTorch paths (install neither `fla` nor hub `kernels`: transformers would dispatch to them).

Run:
    python3 tools/k3_reference.py tests/fixtures/k3-tiny --ids 5 6 7 --new 8
    python3 -c "import sys; sys.path.insert(0, 'tools'); import k3_reference as r; \
                m = r.load_k3('tests/fixtures/k3-tiny'); print(r.greedy(m, [5, 6, 7], 8))"
tools/make_golden.py builds the K3 fixtures with it; tools/test_k3_reference.py checks it.
"""

import argparse
import dataclasses
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn
from transformers import KimiLinearConfig
from transformers.models.kimi_linear.modeling_kimi_linear import (
    KimiLinearAttention,
    KimiLinearMLP,
    KimiLinearRMSNorm,
    KimiLinearRMSNormGated,
    KimiLinearTopkRouter,
    causal_conv1d_fn,
    chunk_kimi_delta_attention,
    eager_attention_forward,
)

TEXT_PREFIX = "language_model."  # K3 checkpoint keys of the text model (docs/k3.md "Checkpoint tensors")
SKIPPED_PREFIXES = ("vision_tower.", "mm_projector.")  # K3's vision parts: not read for text serving
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
A_LOG_PAD = 128  # K3 stores A_log as one row zero-padded to a multiple of 128 entries

# MXFP4 (docs/k3.md "MXFP4"): e2m1 codes, bit 3 = sign, bits 0-2 index these magnitudes; one UE8M0 scale
# 2^(s - 127) per group of 32 columns.
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
MXFP4_GROUP = 32
UE8M0_BIAS = 127

KDA, MLA = "kda", "mla"
DENSE, MOE = "dense", "moe"


# ---------------------------------------------------------------------------------------------------------------------
# Config


@dataclasses.dataclass(frozen=True)
class TextConfig:
    """The text model's settings (MODEL.md §2). K3 features are off (None / False) when the config lacks them."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    rms_norm_eps: float
    attn: tuple  # KDA | MLA per layer (0-based)
    ffn: tuple  # DENSE | MOE per layer
    # KDA
    kda_heads: int
    kda_head_dim: int
    kda_conv_kernel: int
    gate_lower_bound: float | None  # [K3] bounded forget gate; None: Kimi Linear's softplus gate
    full_rank_gate: bool  # [K3] g_proj instead of g_b_proj(g_a_proj(x))
    a_log_padded: bool  # [K3] A_log stored as [128·k] instead of [1, 1, H, 1]
    # MLA
    num_attention_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    mla_output_gate: bool  # [K3] sigmoid(g_proj(x)) on the head outputs before o_proj
    # FFN
    intermediate_size: int
    hidden_act: str  # "silu" | [K3] "situ"
    situ_beta: float | None
    situ_linear_beta: float | None
    num_experts: int
    num_experts_per_token: int
    moe_intermediate_size: int
    num_shared_experts: int
    num_expert_group: int
    topk_group: int
    moe_renormalize: bool
    routed_scaling_factor: float
    latent_size: int | None  # [K3] routed_expert_hidden_size: routed experts work in this latent width
    latent_norm: bool  # [K3] latent_moe_use_norm
    # Residual
    attn_res_block_size: int | None  # [K3] AttnRes; None: plain pre-norm residual
    mxfp4_experts: bool  # [K3] routed experts stored MXFP4 (compressed-tensors)
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list | None = None

    @staticmethod
    def from_dict(text: dict, k3: bool) -> "TextConfig":
        """Parses a Moonshot-style (1-based layer lists) or transformers-style (layer_types) text config."""
        lac = text.get("linear_attn_config") or {}
        layers = text["num_hidden_layers"]
        attn = _attn_schedule(text, lac, layers)
        ffn = _ffn_schedule(text, layers)
        if text.get("moe_router_activation_func", "sigmoid") != "sigmoid":
            raise ValueError("only sigmoid routing exists in Kimi models")
        if not text.get("mla_use_nope", True):
            raise ValueError("only NoPE MLA exists in Kimi models")
        if text.get("topk_method", "noaux_tc") != "noaux_tc":
            raise ValueError(f"topk_method {text['topk_method']!r}: only noaux_tc exists in Kimi models")
        hidden_act = text.get("hidden_act", "silu")
        if hidden_act not in ("silu", "situ"):
            raise ValueError(f"hidden_act {hidden_act!r}")
        quant = text.get("quantization_config")
        if quant is not None:
            formats = {quant.get("format")} | {g.get("format") for g in quant.get("config_groups", {}).values()}
            if quant.get("quant_method") != "compressed-tensors" or formats - {None} != {"mxfp4-pack-quantized"}:
                raise ValueError(f"unsupported quantization_config {quant}")
        latent = text.get("routed_expert_hidden_size")
        return TextConfig(
            vocab_size=text["vocab_size"],
            hidden_size=text["hidden_size"],
            num_hidden_layers=layers,
            rms_norm_eps=text["rms_norm_eps"],
            attn=attn,
            ffn=ffn,
            kda_heads=lac.get("num_heads", text.get("linear_num_heads")),
            kda_head_dim=lac.get("head_dim", text.get("linear_head_dim")),
            kda_conv_kernel=lac.get("short_conv_kernel_size", text.get("linear_conv_kernel_dim")),
            gate_lower_bound=lac.get("gate_lower_bound"),
            full_rank_gate=bool(lac.get("use_full_rank_gate", False)),
            a_log_padded=k3,
            num_attention_heads=text["num_attention_heads"],
            q_lora_rank=text.get("q_lora_rank"),
            kv_lora_rank=text["kv_lora_rank"],
            qk_nope_head_dim=text["qk_nope_head_dim"],
            qk_rope_head_dim=text["qk_rope_head_dim"],
            v_head_dim=text["v_head_dim"],
            mla_output_gate=bool(text.get("mla_use_output_gate", False)),
            intermediate_size=text["intermediate_size"],
            hidden_act=hidden_act,
            situ_beta=text.get("activation_situ_beta") if hidden_act == "situ" else None,
            situ_linear_beta=text.get("activation_situ_linear_beta") if hidden_act == "situ" else None,
            num_experts=text["num_experts"],
            num_experts_per_token=text["num_experts_per_token"],
            moe_intermediate_size=text["moe_intermediate_size"],
            num_shared_experts=text["num_shared_experts"],
            num_expert_group=text["num_expert_group"],
            topk_group=text["topk_group"],
            moe_renormalize=text["moe_renormalize"],
            routed_scaling_factor=text["routed_scaling_factor"],
            latent_size=latent,
            latent_norm=latent is not None and bool(text.get("latent_moe_use_norm", False)),
            attn_res_block_size=text.get("attn_res_block_size") or None,
            mxfp4_experts=quant is not None,
            pad_token_id=text.get("pad_token_id"),
            bos_token_id=text.get("bos_token_id"),
            eos_token_id=text.get("eos_token_id"),
        )

    def transformers_config(self) -> KimiLinearConfig:
        """A KimiLinearConfig for the transformers modules reused here. hidden_act is "silu": transformers uses it
        for the KDA conv (silu in K3 too, MODEL.md §5.2); SiTU is applied by this file's MLPs."""
        return KimiLinearConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            layer_types=["linear_attention" if a == KDA else "full_attention" for a in self.attn],
            mlp_layer_types=["sparse" if f == MOE else "dense" for f in self.ffn],
            linear_num_heads=self.kda_heads or 1,
            linear_head_dim=self.kda_head_dim or 1,
            linear_conv_kernel_dim=self.kda_conv_kernel or 1,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_attention_heads,
            q_lora_rank=self.q_lora_rank,
            kv_lora_rank=self.kv_lora_rank,
            qk_nope_head_dim=self.qk_nope_head_dim,
            qk_rope_head_dim=self.qk_rope_head_dim,
            v_head_dim=self.v_head_dim,
            intermediate_size=self.intermediate_size,
            moe_intermediate_size=self.moe_intermediate_size,
            num_experts=self.num_experts,
            num_experts_per_token=self.num_experts_per_token,
            num_shared_experts=self.num_shared_experts,
            num_expert_group=self.num_expert_group,
            topk_group=self.topk_group,
            moe_renormalize=self.moe_renormalize,
            routed_scaling_factor=self.routed_scaling_factor,
            rms_norm_eps=self.rms_norm_eps,
            hidden_act="silu",
            pad_token_id=self.pad_token_id,
            bos_token_id=self.bos_token_id,
            eos_token_id=self.eos_token_id,
            tie_word_embeddings=False,
        )


def _attn_schedule(text: dict, lac: dict, layers: int) -> tuple:
    """MODEL.md §2.4: layer_types (0-based) or Moonshot's 1-based kda_layers / full_attn_layers; no default."""
    if "layer_types" in text:
        return tuple(KDA if t == "linear_attention" else MLA for t in text["layer_types"])
    if "kda_layers" not in lac or "full_attn_layers" not in lac:
        raise ValueError("the config names no attention schedule (layer_types or linear_attn_config lists)")
    kinds = [None] * layers
    for n in lac["full_attn_layers"]:
        kinds[n - 1] = MLA  # 1-based
    for n in lac["kda_layers"]:
        if kinds[n - 1] is not None:
            raise ValueError(f"layer {n} (1-based) is both KDA and MLA")
        kinds[n - 1] = KDA
    if None in kinds:
        raise ValueError(f"layers {[i + 1 for i, k in enumerate(kinds) if k is None]} (1-based) have no kind")
    return tuple(kinds)


def _ffn_schedule(text: dict, layers: int) -> tuple:
    if "mlp_layer_types" in text:
        return tuple(MOE if t == "sparse" else DENSE for t in text["mlp_layer_types"])
    first_dense, freq = text["first_k_dense_replace"], text.get("moe_layer_freq", 1)
    moe = [text["num_experts"] > 0 and i >= first_dense and i % freq == 0 for i in range(layers)]
    return tuple(MOE if m else DENSE for m in moe)


# ---------------------------------------------------------------------------------------------------------------------
# MXFP4


def dequantize_mxfp4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """compressed-tensors mxfp4-pack-quantized -> fp32 (docs/k3.md "MXFP4", MODEL.md §7.5).

    packed [R, C/2] uint8: two e2m1 codes per byte, the LOW nibble is the even column; code bit 3 = sign, bits 0-2
    index E2M1_MAGNITUDES. scale [R, C/32] uint8: UE8M0 exponent s, the group of 32 columns is scaled by
    2^(s - 127). Every result is exact in fp32.
    """
    if packed.dtype != torch.uint8 or scale.dtype != torch.uint8 or packed.dim() != 2 or scale.dim() != 2:
        raise ValueError(f"MXFP4 wants 2-D uint8 packed/scale, got {packed.dtype} {packed.shape}, {scale.dtype}")
    rows, columns = packed.shape[0], packed.shape[1] * 2
    if scale.shape != (rows, columns // MXFP4_GROUP) or columns % MXFP4_GROUP:
        raise ValueError(f"MXFP4 scale {tuple(scale.shape)} does not fit packed {tuple(packed.shape)}")
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(rows, columns).long()  # low nibble first
    magnitude = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float64)[codes & 0x7]
    sign = torch.where((codes & 0x8) != 0, -1.0, 1.0).double()
    group_scale = torch.exp2(scale.double() - UE8M0_BIAS).repeat_interleave(MXFP4_GROUP, dim=1)
    return (sign * magnitude * group_scale).float()


# ---------------------------------------------------------------------------------------------------------------------
# Building blocks: K3 deltas


def situ(gate: torch.Tensor, up: torch.Tensor, beta: float, linear_beta: float) -> torch.Tensor:
    """SiTU (MODEL.md §7.4, docs/k3.md): act(g, u) = [β·tanh(g/β)·sigmoid(g)] · [β_l·tanh(u/β_l)], in fp32."""
    g, u = gate.float(), up.float()
    out = (beta * torch.tanh(g / beta) * torch.sigmoid(g)) * (linear_beta * torch.tanh(u / linear_beta))
    return out.to(gate.dtype)


def gated_activation(cfg: TextConfig):
    """act(gate, up) of every gated MLP: silu(gate)·up (transformers' KimiLinearMLP) or [K3] SiTU."""
    if cfg.hidden_act == "situ":
        return lambda gate, up: situ(gate, up, cfg.situ_beta, cfg.situ_linear_beta)
    return lambda gate, up: F.silu(gate) * up


class SituMLP(KimiLinearMLP):
    """transformers' KimiLinearMLP (gate_proj, up_proj, down_proj) with [K3] SiTU: down(act(gate x, up x))."""

    def __init__(self, tf_config: KimiLinearConfig, cfg: TextConfig, intermediate_size: int):
        super().__init__(tf_config, intermediate_size)
        self.situ = gated_activation(cfg)

    def forward(self, x):
        return self.down_proj(self.situ(self.gate_proj(x), self.up_proj(x)))


def make_mlp(tf_config: KimiLinearConfig, cfg: TextConfig, intermediate_size: int) -> nn.Module:
    if cfg.hidden_act == "situ":
        return SituMLP(tf_config, cfg, intermediate_size)
    return KimiLinearMLP(tf_config, intermediate_size)


def attn_res(partial: torch.Tensor, blocks: list, norm_weight: torch.Tensor, proj_weight: torch.Tensor, eps: float):
    """Block attention residual (MODEL.md §8.2, docs/k3.md "AttnRes"), all fp32.

    Candidates are the block snapshots and the running sum `partial`. Each candidate v scores
    Σ_d (v·rsqrt(mean(v²) + eps))[d] · norm_w[d] · proj_w[0][d] (no weight inside the rmsnorm); the softmax over
    the candidates mixes the RAW candidates.
    """
    candidates = torch.stack([*blocks, partial]).float()  # [C, ..., hidden]
    weights = attn_res_weights(candidates, norm_weight, proj_weight, eps)
    return (weights.unsqueeze(-1) * candidates).sum(0).to(partial.dtype)


def attn_res_weights(candidates: torch.Tensor, norm_weight: torch.Tensor, proj_weight: torch.Tensor, eps: float):
    """softmax over the candidates [C, ..., hidden] of their AttnRes scores -> [C, ...] (see attn_res)."""
    keys = candidates * torch.rsqrt(candidates.pow(2).mean(-1, keepdim=True) + eps)
    scores = (keys * norm_weight.float() * proj_weight.float()[0]).sum(-1)
    return scores.softmax(dim=0)


class AttnResNorm(nn.Module):
    """Holds an AttnRes norm weight [hidden] (checkpoint `*_res_norm.weight`); attn_res() uses it."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))


# ---------------------------------------------------------------------------------------------------------------------
# KDA


class K3DeltaAttention(nn.Module):
    """Kimi Delta Attention with the checkpoint's flat names (self_attn.{q,k,v}_proj, {q,k,v}_conv1d, f_a/f_b_proj,
    A_log, dt_bias, b_proj, g_proj or g_a/g_b_proj, o_norm, o_proj). The conv, the chunked KDA core (with its fp32
    L2 norm, eps 1e-6, chunk 64) and the sigmoid-gated o_norm are transformers'; the gates are the K3 deltas."""

    def __init__(self, cfg: TextConfig):
        super().__init__()
        hidden, heads, head_dim = cfg.hidden_size, cfg.kda_heads, cfg.kda_head_dim
        dim, kernel = heads * head_dim, cfg.kda_conv_kernel
        self.num_heads, self.head_dim = heads, head_dim
        self.gate_lower_bound = cfg.gate_lower_bound
        for p in ("q", "k", "v"):
            setattr(self, f"{p}_proj", nn.Linear(hidden, dim, bias=False))
            setattr(self, f"{p}_conv1d", nn.Conv1d(dim, dim, kernel, groups=dim, bias=False))  # weight [D, 1, W]
        self.f_a_proj = nn.Linear(hidden, head_dim, bias=False)
        self.f_b_proj = nn.Linear(head_dim, dim, bias=False)
        a_log_shape = (-(-heads // A_LOG_PAD) * A_LOG_PAD,) if cfg.a_log_padded else (1, 1, heads, 1)
        self.A_log = nn.Parameter(torch.zeros(a_log_shape))
        self.dt_bias = nn.Parameter(torch.zeros(dim))
        self.b_proj = nn.Linear(hidden, heads, bias=False)
        if cfg.full_rank_gate:
            self.g_proj = nn.Linear(hidden, dim, bias=False)
        else:
            self.g_a_proj = nn.Linear(hidden, head_dim, bias=False)
            self.g_b_proj = nn.Linear(head_dim, dim, bias=False)
        self.full_rank_gate = cfg.full_rank_gate
        self.o_norm = KimiLinearRMSNormGated(head_dim, eps=cfg.rms_norm_eps)
        self.o_proj = nn.Linear(dim, hidden, bias=False)

    def short_conv(self, x: torch.Tensor, conv: nn.Conv1d) -> torch.Tensor:
        """transformers' causal_conv1d_fn (depthwise, causal, zero history) with silu, on [B, T, D]."""
        return causal_conv1d_fn(x.transpose(1, 2), weight=conv.weight.squeeze(1), activation="silu").transpose(1, 2)

    def forget_gate(self, x: torch.Tensor) -> torch.Tensor:
        """g [B, T, H, K] fp32, g <= 0 (MODEL.md §5.3). graw = f_b(f_a(x)) + dt_bias, A = exp(A_log[h]) with A_log
        read from the first H entries (K3: a zero-padded 1-D tensor)."""
        shape = (*x.shape[:2], self.num_heads, self.head_dim)
        graw = (self.f_b_proj(self.f_a_proj(x)).float() + self.dt_bias.float()).view(shape)
        decay_rate = torch.exp(self.A_log.float().reshape(-1)[: self.num_heads]).view(1, 1, -1, 1)
        if self.gate_lower_bound is not None:
            # [K3] bounded gate: g = lower_bound · sigmoid(exp(A_log[h]) · (graw + dt_bias))   (docs/k3.md, §5.3)
            return self.gate_lower_bound * torch.sigmoid(decay_rate * graw)
        # Kimi Linear: g = -exp(A_log[h]) · softplus(graw + dt_bias), softplus threshold 20, exactly as written in
        # transformers' KimiLinearForgetGate (whose A_log layout [1, 1, H, 1] it shares)
        return -decay_rate * torch.where(graw > 20.0, graw, torch.log(1.0 + torch.exp(graw)))

    def forward(self, x: torch.Tensor, attention_mask=None) -> torch.Tensor:
        shape = (*x.shape[:2], self.num_heads, self.head_dim)
        q = self.short_conv(self.q_proj(x), self.q_conv1d).reshape(shape)
        k = self.short_conv(self.k_proj(x), self.k_conv1d).reshape(shape)
        v = self.short_conv(self.v_proj(x), self.v_conv1d).reshape(shape)
        g = self.forget_gate(x)
        beta = torch.sigmoid(self.b_proj(x).float())
        core, _ = chunk_kimi_delta_attention(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
        if self.full_rank_gate:
            out_gate = self.g_proj(x)  # [K3] full-rank output gate og = x·g_projᵀ   (docs/k3.md, MODEL.md §5.8)
        else:
            out_gate = self.g_b_proj(self.g_a_proj(x))
        y = self.o_norm(core, out_gate.view(shape)).reshape(*x.shape[:2], -1)
        return self.o_proj(y)


# ---------------------------------------------------------------------------------------------------------------------
# MLA


class K3Attention(KimiLinearAttention):
    """transformers' KimiLinearAttention (q or q-LoRA with q_a_layernorm at its class eps 1e-6, kv_a_layernorm eps
    1e-6, NoPE, per-head interleaved kv_b_proj, scale (nope + rope)^-0.5, eager attention) plus the [K3] output gate
    attn ⊙ sigmoid(g_proj(x)) on the [T, H·v] head outputs before o_proj (docs/k3.md, MODEL.md §6.1/§6.3)."""

    def __init__(self, tf_config: KimiLinearConfig, cfg: TextConfig, layer_idx: int):
        super().__init__(tf_config, layer_idx)
        gate_dim = cfg.num_attention_heads * cfg.v_head_dim
        self.g_proj = nn.Linear(cfg.hidden_size, gate_dim, bias=False) if cfg.mla_output_gate else None

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # transformers' KimiLinearAttention.forward without the cache
        batch_size, seq_length = hidden_states.shape[:-1]
        if self.q_lora_rank is None:
            q_states = self.q_proj(hidden_states)
        else:
            q_states = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
        query_states = q_states.view(batch_size, seq_length, -1, self.qk_head_dim).transpose(1, 2)
        compressed_kv = self.kv_a_proj_with_mqa(hidden_states)
        kv_nope, k_rot = torch.split(compressed_kv, [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        kv_nope = self.kv_a_layernorm(kv_nope).view(batch_size, 1, seq_length, self.kv_lora_rank)
        k_rot = k_rot.view(batch_size, 1, seq_length, self.qk_rope_head_dim)
        key_states, value_states = self.expand_kv(kv_nope, k_rot)
        attn_output, _ = eager_attention_forward(
            self, query_states, key_states, value_states, attention_mask, scaling=self.scaling
        )
        attn_output = attn_output.reshape(batch_size, seq_length, -1)
        if self.g_proj is not None:
            # [K3] output gate on the concatenated head outputs, before o_proj: attn ⊙ sigmoid(x·g_projᵀ)
            attn_output = attn_output * torch.sigmoid(self.g_proj(hidden_states))
        return self.o_proj(attn_output)


# ---------------------------------------------------------------------------------------------------------------------
# FFN


class Expert(nn.Module):
    """One routed expert: w2(act(w1 x, w3 x)); w1 = gate, w3 = up, w2 = down (MODEL.md §7.2). In K3 it works in the
    latent width and act is SiTU (§7.3, §7.4)."""

    def __init__(self, cfg: TextConfig, width: int):
        super().__init__()
        self.w1 = nn.Linear(width, cfg.moe_intermediate_size, bias=False)
        self.w3 = nn.Linear(width, cfg.moe_intermediate_size, bias=False)
        self.w2 = nn.Linear(cfg.moe_intermediate_size, width, bias=False)
        self.act = gated_activation(cfg)

    def forward(self, x):
        return self.w2(self.act(self.w1(x), self.w3(x)))


class K3MoE(nn.Module):
    """block_sparse_moe: transformers' KimiLinearTopkRouter on the full hidden x (sigmoid, correction bias for
    selection only, grouped top-k, raw weights, renormalized with +1e-20, × routed_scaling_factor), routed experts
    accumulated in fp32, shared experts on x. [K3] latent MoE (docs/k3.md, MODEL.md §7.3):
        z = routed_expert_down_proj(x); y = Σ_k w_k·E_k(z); y = RMSNorm(y; routed_expert_norm, rms_norm_eps);
        out = routed_expert_up_proj(y) + shared_experts(x)."""

    def __init__(self, tf_config: KimiLinearConfig, cfg: TextConfig):
        super().__init__()
        width = cfg.latent_size or cfg.hidden_size
        self.gate = KimiLinearTopkRouter(tf_config)
        self.experts = nn.ModuleList(Expert(cfg, width) for _ in range(cfg.num_experts))
        self.latent = cfg.latent_size is not None
        if self.latent:
            self.routed_expert_down_proj = nn.Linear(cfg.hidden_size, width, bias=False)
            # transformers-style RMSNorm: normalize in fp32, then the weight multiply
            self.routed_expert_norm = KimiLinearRMSNorm(width, eps=cfg.rms_norm_eps) if cfg.latent_norm else None
            self.routed_expert_up_proj = nn.Linear(width, cfg.hidden_size, bias=False)
        shared = cfg.moe_intermediate_size * cfg.num_shared_experts
        self.shared_experts = make_mlp(tf_config, cfg, shared) if shared > 0 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        _, topk_weights, topk_indices = self.gate(flat)
        z = self.routed_expert_down_proj(flat) if self.latent else flat
        routed = torch.zeros(z.shape, dtype=torch.float32)
        # the expert loop of transformers' KimiLinearExperts (eager): per hit expert, weighted outputs index_add_-ed
        for expert in topk_indices.unique().tolist():
            tokens, slot = torch.where(topk_indices == expert)
            out = self.experts[expert](z[tokens]).float() * topk_weights[tokens, slot, None]
            routed.index_add_(0, tokens, out)
        routed = routed.to(x.dtype)
        if self.latent:
            if self.routed_expert_norm is not None:
                routed = self.routed_expert_norm(routed)
            routed = self.routed_expert_up_proj(routed)
        out = routed.view(x.shape)
        return out + self.shared_experts(x) if self.shared_experts is not None else out


# ---------------------------------------------------------------------------------------------------------------------
# Decoder


class K3DecoderLayer(nn.Module):
    def __init__(self, tf_config: KimiLinearConfig, cfg: TextConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = KimiLinearRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = KimiLinearRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.attn[layer_idx] == KDA:
            self.self_attn = K3DeltaAttention(cfg)
        else:
            self.self_attn = K3Attention(tf_config, cfg, layer_idx)
        # checkpoint names: the dense MLP is `mlp.`, the MoE `block_sparse_moe.`
        self.ffn_name = "block_sparse_moe" if cfg.ffn[layer_idx] == MOE else "mlp"
        if cfg.ffn[layer_idx] == MOE:
            self.block_sparse_moe = K3MoE(tf_config, cfg)
        else:
            self.mlp = make_mlp(tf_config, cfg, cfg.intermediate_size)
        if cfg.attn_res_block_size:
            self.self_attention_res_norm = AttnResNorm(cfg.hidden_size)
            self.self_attention_res_proj = nn.Linear(cfg.hidden_size, 1, bias=False)
            self.mlp_res_norm = AttnResNorm(cfg.hidden_size)
            self.mlp_res_proj = nn.Linear(cfg.hidden_size, 1, bias=False)

    def attention(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.self_attn(self.input_layernorm(x), mask)

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, self.ffn_name)(self.post_attention_layernorm(x))


class K3Model(nn.Module):
    def __init__(self, cfg: TextConfig):
        super().__init__()
        self.cfg = cfg
        tf_config = cfg.transformers_config()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(K3DecoderLayer(tf_config, cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = KimiLinearRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        if cfg.attn_res_block_size:
            self.output_attn_res_norm = AttnResNorm(cfg.hidden_size)
            self.output_attn_res_proj = nn.Linear(cfg.hidden_size, 1, bias=False)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, list]:
        """ids [1, T] -> (final normed hidden [1, T, hidden], per-layer states). The states are the embeddings and,
        after each layer, the residual stream (Kimi Linear) or the running block sum P (AttnRes)."""
        h = self.embed_tokens(ids)
        length = ids.shape[1]
        mask = torch.full((length, length), torch.finfo(h.dtype).min, dtype=h.dtype).triu(1)[None, None]  # causal
        states = [h]
        block, eps = self.cfg.attn_res_block_size, self.cfg.rms_norm_eps
        if block is None:
            # plain pre-norm residual (MODEL.md §8.1), as transformers' KimiLinearDecoderLayer
            for layer in self.layers:
                h = h + layer.attention(h, mask)
                h = h + layer.feed_forward(h)
                states.append(h)
            return self.norm(h), states
        # [K3] AttnRes decoder loop, exactly MODEL.md §8.2
        partial, blocks = h, []
        for i, layer in enumerate(self.layers):
            attn_norm, attn_proj = layer.self_attention_res_norm.weight, layer.self_attention_res_proj.weight
            hin = attn_res(partial, blocks, attn_norm, attn_proj, eps) if blocks else partial
            if i % block == 0:  # snapshot the running sum BEFORE this layer's update
                blocks.append(partial)
                partial = None
            a = layer.attention(hin, mask)
            partial = a if partial is None else partial + a
            hm = attn_res(partial, blocks, layer.mlp_res_norm.weight, layer.mlp_res_proj.weight, eps)
            partial = partial + layer.feed_forward(hm)
            states.append(partial)
        out = attn_res(partial, blocks, self.output_attn_res_norm.weight, self.output_attn_res_proj.weight, eps)
        return self.norm(out), states


class K3ForCausalLM(nn.Module):
    """State dict names = checkpoint names without the `language_model.` prefix (MXFP4 experts as `.weight`)."""

    def __init__(self, cfg: TextConfig):
        super().__init__()
        self.cfg = cfg
        self.model = K3Model(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    @torch.no_grad()
    def forward(self, ids, output_hidden_states: bool = False):
        """ids (sequence of T token ids) -> logits [T, vocab] fp32 from one no-cache pass; with
        output_hidden_states also the per-layer states [num_layers + 1, T, hidden] (see K3Model.forward)."""
        ids = torch.as_tensor(ids, dtype=torch.long).reshape(1, -1)
        normed, states = self.model(ids)
        logits = self.lm_head(normed)[0]
        if output_hidden_states:
            return logits, torch.stack(states)[:, 0]
        return logits


def greedy(model: K3ForCausalLM, prompt, new_tokens: int) -> list:
    """new_tokens greedy ids after prompt by repeated full forwards (argmax of the last row); no cache."""
    ids = [int(i) for i in prompt]
    for _ in range(new_tokens):
        ids.append(int(model(ids)[-1].argmax()))
    return ids[len(prompt) :]


# ---------------------------------------------------------------------------------------------------------------------
# Loading


def read_checkpoint(directory: Path) -> dict:
    """All tensors of model.safetensors (or of the shards a model.safetensors.index.json names), as stored."""
    index = directory / WEIGHTS_INDEX
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else [WEIGHTS_FILE]
    tensors = {}
    for name in files:
        with safe_open(directory / name, framework="pt") as f:
            tensors.update({key: f.get_tensor(key) for key in f.keys()})
    return tensors


def text_state_dict(tensors: dict, cfg: TextConfig, prefix: str) -> dict:
    """Checkpoint tensors -> the fp32 state dict of K3ForCausalLM: drops vision_tower.* / mm_projector.*, strips the
    prefix, dequantizes MXFP4 pairs into `.weight`, maps transformers' save name of the dense MLP."""
    state = {}
    for name, tensor in tensors.items():
        if name.startswith(SKIPPED_PREFIXES):
            continue
        if not name.startswith(prefix):
            raise ValueError(f"checkpoint tensor {name} lacks the prefix {prefix!r}")
        name = name[len(prefix) :]
        if name.endswith(".weight_scale"):
            if prefix + name.removesuffix("_scale") + "_packed" not in tensors:
                raise ValueError(f"{prefix}{name} has no weight_packed")
            continue
        if name.endswith(".weight_packed"):
            base = name.removesuffix("_packed")
            if not cfg.mxfp4_experts:
                raise ValueError(f"{prefix}{name}: MXFP4 tensor but the config has no quantization_config")
            state[base] = dequantize_mxfp4(tensor, tensors[prefix + base + "_scale"])
            continue
        parts = name.split(".")
        # transformers' save_pretrained writes the dense MLP as block_sparse_moe.{gate,up,down}_proj (MODEL.md §3)
        if len(parts) == 6 and parts[1] == "layers" and parts[3] == "block_sparse_moe" and parts[4].endswith("_proj"):
            if cfg.ffn[int(parts[2])] == DENSE:
                name = ".".join([*parts[:3], "mlp", *parts[4:]])
        state[name] = tensor.float()
    return state


def load_k3(directory) -> K3ForCausalLM:
    """The fp32 reference from a K3 (or plain Kimi Linear) checkpoint directory; every tensor must be used."""
    directory = Path(directory)
    config = json.loads((directory / "config.json").read_text())
    k3 = config.get("model_type") == "kimi_k3"
    if not k3 and config.get("model_type") != "kimi_linear":
        raise ValueError(f"model_type {config.get('model_type')!r}: want kimi_k3 or kimi_linear")
    cfg = TextConfig.from_dict(config["text_config"] if k3 else config, k3=k3)
    state = text_state_dict(read_checkpoint(directory), cfg, TEXT_PREFIX if k3 else "")
    model = K3ForCausalLM(cfg)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{directory}: checkpoint does not fit the model: missing {missing}, unexpected {unexpected}")
    if cfg.a_log_padded:
        for i, layer in enumerate(model.model.layers):
            if cfg.attn[i] == KDA and layer.self_attn.A_log[cfg.kda_heads :].any():
                raise ValueError(f"layer {i}: the zero padding of A_log is not zero")
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description="Kimi K3 fp32 reference: logits and greedy continuation")
    parser.add_argument("model", type=Path, help="checkpoint directory (config.json, model.safetensors)")
    parser.add_argument("--ids", type=int, nargs="+", required=True, help="prompt token ids")
    parser.add_argument("--new", type=int, default=8, help="greedy tokens to generate")
    args = parser.parse_args()
    model = load_k3(args.model)
    logits = model(args.ids)
    print(f"logits [{logits.shape[0]}, {logits.shape[1]}], last row top-5 ids {logits[-1].topk(5).indices.tolist()}")
    print("greedy:", greedy(model, args.ids, args.new))


if __name__ == "__main__":
    main()
