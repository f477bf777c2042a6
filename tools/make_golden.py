#!/usr/bin/env python3
"""Generate the golden Kimi Linear fixtures under tests/fixtures/.

Why: helixlm's C++ engine is checked against transformers' native `kimi_linear` model (the reference named in
docs MODEL.md §10). Each fixture is a tiny random model small enough to commit, with reference outputs the C++
tests compare against:

    <fixture>/config.json, generation_config.json   transformers-style config (layer_types, mlp_layer_types)
    <fixture>/model.safetensors                     bf16 weights in the Moonshot checkpoint layout (a few fp32
                                                    tensors that transformers keeps in fp32: router weight,
                                                    e_score_correction_bias, dt_bias)
    <fixture>/logits_<i>.npy                        fp32 [len(prompt) + 24, vocab]: one no-cache forward pass
                                                    over prompt + greedy continuation
    <fixture>/hidden_<i>.npy                        fp32 [num_layers + 1, len(prompt) + 24, hidden] from
                                                    output_hidden_states of that pass (entry 0 = embeddings,
                                                    entry i = output of layer i, the last entry is after the
                                                    final norm, as transformers reports it)
    <fixture>/golden.json                           prompts, greedy continuations (generate() with its cache,
                                                    i.e. the recurrent decode path), and the decision margins
A fixture may also get a `<fixture>-moonshot/` twin: the same weights (relative symlink) with a Hub-style
(Moonshot) config.json, to test that config parser.

Kimi K3 fixtures (k3-*): transformers has no K3 model, so their reference is tools/k3_reference.py (transformers'
kimi_linear blocks plus the K3 deltas of docs/k3.md). Their config.json is K3's nested one (model_type "kimi_k3",
the text model in text_config with 1-based layer lists), written here; model.safetensors has the `language_model.`
prefix, bf16 weights except the f32 ones K3 stores in f32 (conv, o_norm, A_log padded to 128, dt_bias,
e_score_correction_bias), MXFP4 routed experts (quantized here, the reference computes with the dequantized values)
and two tiny vision tensors the engine must skip. Greedy ids come from repeated full forwards (no cache), and
hidden_<i>.npy holds the embeddings and, after each layer, AttnRes's running block sum P (MODEL.md §8.2).

How: each model is built with fixed seeds, saved in bf16 with save_pretrained, and reloaded in fp32 so the
reference computes in fp32 from exactly the weights in the file. It runs on CPU in pure PyTorch (eager attention,
eager experts; the `fla` / hub `kernels` packages must not be installed). The min_route_margin of a fixture (smallest
gap between the last selected and the first rejected expert or group) must be at least MIN_ROUTE_MARGIN, because
the engine computes the same router scores with a different summation order; a fixture whose margin is too small
is rebuilt with the next seed. With ~1000 routing decisions per fixture most seeds miss the margin somewhere, so a
seed is first screened on passes over the prompts alone (cheap, no greedy decoding): their tokens are routed the same
way in the final pass, whose margin can only be smaller.

Rerun (takes about a minute on CPU; the output is deterministic; with the default --out it also points the
bundled model models/kimi-linear-tiny at the first fixture; --only NAME builds just that fixture, leaving the
others as they are):
    python3 tools/make_golden.py [--out tests/fixtures] [--only NAME ...]
To add a fixture, append a FixtureSpec to FIXTURES.
"""

import argparse
import copy
import dataclasses
import importlib.util
import json
import math
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file
from transformers import KimiLinearConfig, KimiLinearForCausalLM
from transformers.models.kimi_linear.modeling_kimi_linear import (
    KimiLinearRMSNorm,
    KimiLinearRMSNormGated,
    KimiLinearTopkRouter,
)

import k3_reference

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures"
BUNDLED_MODEL = REPO_ROOT / "models" / "kimi-linear-tiny"  # symlink to the first fixture
WEIGHTS_FILE = "model.safetensors"

PROMPT_LENGTHS = (1, 37, 150)  # 150 > 128 and not a multiple of the 64-token chunk
NEW_TOKENS = 24
FIRST_PROMPT_ID = 3  # prompts avoid pad (0), bos (1) and eos (2)
MIN_ROUTE_MARGIN = 1e-4
SEED_ATTEMPTS = 100
ARGMAX_CHECK_MARGIN = 1e-3
MAX_FIXTURES_BYTES = 16 * 1024 * 1024
OPTIONAL_KERNEL_PACKAGES = ("fla", "kernels", "causal_conv1d")

# Init: transformers' default (std 0.02) gives nearly flat logits. A larger std gives logits with std ~ 1-3; the router
# gets a larger std still and a random correction bias so that its scores are well spread. A_log and dt_bias keep
# transformers' own init (A = exp(A_log) in [1, 16]). Norm weights get a random scale so that a missing one shows.
INITIALIZER_RANGE = 0.2
ROUTER_WEIGHT_STD = 0.3
ROUTER_BIAS_STD = 0.05
NORM_WEIGHT_STD = 0.2

COMMON_DIMS = dict(
    vocab_size=512,
    hidden_size=64,
    linear_num_heads=8,
    linear_head_dim=16,
    linear_conv_kernel_dim=4,
    num_attention_heads=8,
    num_key_value_heads=8,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    intermediate_size=128,
    moe_intermediate_size=32,
    num_experts=16,
    rms_norm_eps=1e-5,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=False,
    initializer_range=INITIALIZER_RANGE,
)

KDA, MLA = "linear_attention", "full_attention"
DENSE, MOE = "dense", "sparse"
ReferenceModel = KimiLinearForCausalLM | k3_reference.K3ForCausalLM

# Kimi K3 (docs/k3.md): the text_config of every K3 fixture before its FixtureSpec.config. Same dims as COMMON_DIMS
# plus q-LoRA, a latent width of 32 for the routed experts and K3's features. The AttnRes projections get their own
# std. AttnRes amplifies fp32 rounding: a score error moves softmax weight between candidates whose magnitudes differ
# by 10-20x in these tiny random models. With std 0.2 (mean top weight ~0.7) the logits of an fp32 run differ from an
# fp64 run by up to ~2e-4, above the 1e-4 the multi-rank parity tests demand, so rounding could not be told from a
# bug; std 0.06 keeps the softmax clearly non-uniform (as in K3, whose mixing logits sit close together) with an fp32
# noise floor near 5e-5.
K3_LINEAR_ATTN = dict(
    num_heads=8, head_dim=16, short_conv_kernel_size=4, gate_lower_bound=-5.0, use_full_rank_gate=True
)
K3_QUANTIZATION_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "mxfp4-pack-quantized",
    "config_groups": {
        "group_0": {
            "format": "mxfp4-pack-quantized",
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32, "symmetric": True},
        }
    },
    "ignore": [
        "lm_head",
        "re:.*self_attn.*",
        "re:.*shared_experts.*",
        "re:.*mlp\\.(gate|up|down)_proj.*",
        "re:.*routed_expert_.*",
        "re:.*block_sparse_moe.gate.*",
        "re:.*vision_tower.*",
        "re:.*mm_projector.*",
    ],
}
K3_TEXT_CONFIG = dict(
    model_type="kimi_linear",
    vocab_size=512,
    hidden_size=64,
    num_attention_heads=8,
    num_key_value_heads=8,
    q_lora_rank=32,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    mla_use_nope=True,
    mla_use_output_gate=True,
    intermediate_size=128,
    first_k_dense_replace=1,
    moe_layer_freq=1,
    num_experts=16,
    num_experts_per_token=4,
    moe_intermediate_size=32,
    routed_expert_hidden_size=32,
    latent_moe_use_norm=True,
    moe_router_activation_func="sigmoid",
    topk_method="noaux_tc",
    use_grouped_topk=True,
    hidden_act="situ",
    activation_situ_beta=4.0,
    activation_situ_linear_beta=25.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    quantization_config=K3_QUANTIZATION_CONFIG,
)
ATTN_RES_PROJ_STD = 0.06
K3_FP32_TENSORS = ("_conv1d.weight", "o_norm.weight", "A_log", "dt_bias", "e_score_correction_bias")  # name suffixes
K3_EXTRA_TENSORS = ("vision_tower.patch_embed.weight", "mm_projector.proj.weight")  # [4, 4] bf16, not text


@dataclasses.dataclass(frozen=True)
class FixtureSpec:
    name: str
    seed: int  # first seed tried; later ones are seed + 1, seed + 2, ... (see MIN_ROUTE_MARGIN)
    config: dict  # KimiLinearConfig arguments on top of COMMON_DIMS (K3: text_config fields on top of K3_TEXT_CONFIG)
    moonshot_twin: bool = False  # also write <name>-moonshot/ with a Hub-style config.json
    k3: bool = False  # a Kimi K3 fixture, computed by tools/k3_reference.py
    # Init std of projections/embeddings and of norm weights around 1. The loud defaults make formula errors show in
    # fp32, but amplify bf16 rounding ~10x (tools/bf16_reference.py); a realistic fixture uses transformers' 0.02 so
    # that the GPU's bf16 path can be held to DESIGN.md's 2e-2.
    init_std: float = INITIALIZER_RANGE
    norm_std: float = NORM_WEIGHT_STD


FIXTURES = [
    FixtureSpec(
        name="kimi-tiny-dense-first",
        seed=1000,
        config=dict(
            layer_types=[KDA, KDA, MLA, KDA],
            mlp_layer_types=[DENSE, MOE, MOE, MOE],
            q_lora_rank=None,
            num_expert_group=1,
            topk_group=1,
            moe_renormalize=True,
            routed_scaling_factor=2.446,
            num_experts_per_token=4,
            num_shared_experts=1,
        ),
        moonshot_twin=True,
    ),
    FixtureSpec(
        name="kimi-tiny-qlora-moe-first",
        seed=2000,
        config=dict(
            layer_types=[MLA, KDA, KDA, MLA],
            mlp_layer_types=[MOE, MOE, DENSE, MOE],
            q_lora_rank=32,
            num_expert_group=4,
            topk_group=2,
            moe_renormalize=False,
            routed_scaling_factor=1.0,
            num_experts_per_token=4,
            num_shared_experts=2,
        ),
    ),
    FixtureSpec(
        name="kimi-tiny-grouped",
        seed=3000,
        config=dict(
            layer_types=[KDA, MLA, KDA, KDA, MLA],
            mlp_layer_types=[DENSE, MOE, MOE, MOE, MOE],
            q_lora_rank=24,
            num_expert_group=2,
            topk_group=1,
            moe_renormalize=True,
            routed_scaling_factor=2.0,
            num_experts_per_token=3,
            num_shared_experts=1,
        ),
    ),
    FixtureSpec(
        name="kimi-tiny-realistic",
        seed=6000,
        config=dict(
            layer_types=[KDA, MLA, KDA, MLA],
            mlp_layer_types=[DENSE, MOE, MOE, MOE],
            q_lora_rank=None,
            num_expert_group=1,
            topk_group=1,
            moe_renormalize=True,
            routed_scaling_factor=2.446,
            num_experts_per_token=4,
            num_shared_experts=1,
        ),
        init_std=0.02,
        norm_std=0.02,
    ),
    FixtureSpec(
        name="k3-tiny",
        seed=4000,
        config=dict(
            num_hidden_layers=6,
            linear_attn_config=dict(K3_LINEAR_ATTN, kda_layers=[1, 2, 4], full_attn_layers=[3, 5, 6]),
            num_expert_group=1,
            topk_group=1,
            moe_renormalize=True,
            routed_scaling_factor=1.0,
            num_shared_experts=2,
            attn_res_block_size=2,
        ),
        k3=True,
    ),
    FixtureSpec(
        name="k3-tiny-grouped",
        seed=5000,
        config=dict(
            num_hidden_layers=5,
            linear_attn_config=dict(K3_LINEAR_ATTN, kda_layers=[2, 3], full_attn_layers=[1, 4, 5]),
            num_expert_group=4,
            topk_group=2,
            moe_renormalize=False,
            routed_scaling_factor=1.5,
            num_shared_experts=1,
            attn_res_block_size=3,
        ),
        k3=True,
    ),
    FixtureSpec(
        name="k3-tiny-realistic",
        seed=7000,
        config=dict(
            num_hidden_layers=5,
            linear_attn_config=dict(K3_LINEAR_ATTN, kda_layers=[1, 3, 4], full_attn_layers=[2, 5]),
            num_expert_group=1,
            topk_group=1,
            moe_renormalize=True,
            routed_scaling_factor=1.0,
            num_shared_experts=1,
            attn_res_block_size=2,
        ),
        k3=True,
        init_std=0.02,
        norm_std=0.02,
    ),
    # MXFP4 experts wide enough to split over --moe-tp: 128 intermediate rows are 4 scale groups of 32, so
    # moe_tp 2 and 4 both give each rank whole groups (the parity suite runs EP x TP splits on it).
    FixtureSpec(
        name="k3-tiny-moe-tp",
        seed=6000,
        config=dict(
            num_hidden_layers=4,
            linear_attn_config=dict(K3_LINEAR_ATTN, kda_layers=[1, 3], full_attn_layers=[2, 4]),
            num_expert_group=1,
            topk_group=1,
            moe_renormalize=True,
            routed_scaling_factor=1.0,
            num_shared_experts=1,
            moe_intermediate_size=128,
            attn_res_block_size=2,
        ),
        k3=True,
    ),
]


def make_config(spec: FixtureSpec) -> KimiLinearConfig:
    dims = dict(COMMON_DIMS, initializer_range=spec.init_std)
    return KimiLinearConfig(num_hidden_layers=len(spec.config["layer_types"]), **dims, **spec.config)


# ---------------------------------------------------------------------------------------------------------------------
# Model: build, save in bf16, reload in fp32


def build_random_model(config: KimiLinearConfig, seed: int, norm_std: float) -> KimiLinearForCausalLM:
    """transformers' init (config.initializer_range), then a spread-out router and random norm weights."""
    torch.manual_seed(seed)
    model = KimiLinearForCausalLM(config)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, KimiLinearTopkRouter):
                module.weight.normal_(0.0, ROUTER_WEIGHT_STD)
                module.e_score_correction_bias.normal_(0.0, ROUTER_BIAS_STD)
            elif isinstance(module, (KimiLinearRMSNorm, KimiLinearRMSNormGated)):
                module.weight.normal_(1.0, norm_std)
    return model


def cast_to_checkpoint_dtypes(model: KimiLinearForCausalLM) -> None:
    """bf16 everywhere except the tensors transformers itself keeps in fp32 when it loads a model in bf16."""
    keep_fp32 = model._keep_in_fp32_modules_strict
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if not any(pattern in name for pattern in keep_fp32):
            tensor.data = tensor.data.to(torch.bfloat16)


def load_reference(directory: Path) -> KimiLinearForCausalLM:
    """The fp32 reference: exact bf16 weights from the file, computed in fp32 on plain PyTorch paths."""
    model, loading_info = KimiLinearForCausalLM.from_pretrained(
        directory,
        dtype=torch.float32,
        attn_implementation="eager",
        experts_implementation="eager",
        output_loading_info=True,
    )
    assert not any(loading_info.values()), f"{directory.name}: checkpoint does not match the model: {loading_info}"
    return model.eval()


def save_and_reload(model: KimiLinearForCausalLM, directory: Path) -> KimiLinearForCausalLM:
    """Saves model in checkpoint dtypes as directory/ and returns the fp32 reference loaded back from it."""
    if directory.exists():
        shutil.rmtree(directory)
    cast_to_checkpoint_dtypes(model)
    model.save_pretrained(directory)
    assert sorted(p.name for p in directory.glob("*.safetensors")) == [WEIGHTS_FILE], "expected one weights file"
    reference = load_reference(directory)
    saved, loaded = model.state_dict(), reference.state_dict()
    assert saved.keys() == loaded.keys() and all(torch.equal(saved[k].float(), loaded[k]) for k in saved)
    return reference


# ---------------------------------------------------------------------------------------------------------------------
# Kimi K3: config.json, random checkpoint with MXFP4 routed experts, reference loaded back by tools/k3_reference.py


def make_k3_config(spec: FixtureSpec) -> dict:
    """K3's nested config.json (docs/k3.md "config.json", MODEL.md §2.3): the text model in text_config."""
    return {
        "model_type": "kimi_k3",
        "architectures": ["KimiK3ForConditionalGeneration"],
        "media_placeholder_token_id": 163605,
        "text_config": copy.deepcopy(K3_TEXT_CONFIG) | copy.deepcopy(spec.config),
        "vision_config": {"model_type": "kimi_k3_vision", "hidden_size": 16},
    }


def init_k3_weights(model: k3_reference.K3ForCausalLM, init_std: float, norm_std: float) -> None:
    """The spirit of build_random_model: init_std for projections, embeddings and convs, a spread-out
    router, random norm weights, AttnRes projections with ATTN_RES_PROJ_STD, and transformers' FLA-style init of
    A_log (log of uniform [1, 16], first H entries; the padding stays zero) and dt_bias (inverse softplus of a
    log-uniform dt in [1e-3, 1e-1])."""
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, KimiLinearTopkRouter):
                module.weight.normal_(0.0, ROUTER_WEIGHT_STD)
                module.e_score_correction_bias.normal_(0.0, ROUTER_BIAS_STD)
            elif isinstance(module, (KimiLinearRMSNorm, KimiLinearRMSNormGated, k3_reference.AttnResNorm)):
                module.weight.normal_(1.0, norm_std)
            elif isinstance(module, torch.nn.Linear) and name.endswith("_res_proj"):
                module.weight.normal_(0.0, ATTN_RES_PROJ_STD)
            elif isinstance(module, (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d)):
                module.weight.normal_(0.0, init_std)
            elif isinstance(module, k3_reference.K3DeltaAttention):
                module.A_log.zero_()
                module.A_log[: module.num_heads] = torch.empty(module.num_heads).uniform_(1.0, 16.0).log()
                dt = torch.empty_like(module.dt_bias).uniform_(math.log(1e-3), math.log(1e-1)).exp().clamp_min(1e-4)
                module.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus


def quantize_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 [R, C] -> (weight_packed [R, C/2] u8, weight_scale [R, C/32] u8, the fp32 values they encode).

    Per group of 32 columns the UE8M0 exponent s is the smallest with max|w| / 2^(s - 127) <= 6 (the largest e2m1
    magnitude); each w / 2^(s - 127) goes to the nearest e2m1 magnitude (ties to the smaller one), the sign in bit 3
    (left clear for zero). Two codes per byte, the even column in the low nibble (docs/k3.md "MXFP4").
    """
    group, magnitudes = k3_reference.MXFP4_GROUP, torch.tensor(k3_reference.E2M1_MAGNITUDES, dtype=torch.float64)
    rows, columns = weight.shape
    groups = weight.double().reshape(rows, columns // group, group)
    amax = groups.abs().amax(dim=-1)
    assert (amax > 0).all(), "an all-zero group has no defined scale"
    exponent = torch.ceil(torch.log2(amax / magnitudes[-1]))
    exponent = torch.where(amax / torch.exp2(exponent) > magnitudes[-1], exponent + 1, exponent)  # log2 rounding
    assert (amax / torch.exp2(exponent) <= magnitudes[-1]).all()
    assert (amax / torch.exp2(exponent - 1) > magnitudes[-1]).all(), "not the smallest exponent"
    scale = torch.exp2(exponent)[..., None]
    scaled = groups / scale
    index = (scaled.abs()[..., None] - magnitudes).abs().argmin(dim=-1)  # first minimum: ties to the smaller
    negative = (scaled < 0) & (index > 0)
    values = torch.where(negative, -1.0, 1.0).double() * magnitudes[index] * scale
    assert ((values - groups).abs() <= scale).all(), "off the e2m1 grid by more than half its widest step"
    codes = (index | negative.long() << 3).reshape(rows, columns).to(torch.uint8)
    packed = codes[:, 0::2] | codes[:, 1::2] << 4
    scale_codes = (exponent + k3_reference.UE8M0_BIAS).to(torch.uint8)
    assert (exponent + k3_reference.UE8M0_BIAS).min() >= 0 and (exponent + k3_reference.UE8M0_BIAS).max() <= 254
    return packed.contiguous(), scale_codes.contiguous(), values.reshape(rows, columns).float()


def k3_checkpoint(model: k3_reference.K3ForCausalLM) -> tuple[dict, dict]:
    """(checkpoint tensors, the fp32 values of the MXFP4 routed experts by state-dict name). bf16 except the f32
    K3_FP32_TENSORS; routed experts as weight_packed + weight_scale; plus K3_EXTRA_TENSORS."""
    tensors, experts = {}, {}
    for name, tensor in model.state_dict().items():
        key = k3_reference.TEXT_PREFIX + name
        if ".experts." in name:
            base = key.removesuffix(".weight")
            tensors[base + ".weight_packed"], tensors[base + ".weight_scale"], experts[name] = quantize_mxfp4(tensor)
        elif name.endswith(K3_FP32_TENSORS):
            tensors[key] = tensor.float().contiguous()
        else:
            tensors[key] = tensor.to(torch.bfloat16).contiguous()
    for key in K3_EXTRA_TENSORS:
        tensors[key] = torch.empty(4, 4).normal_(0.0, INITIALIZER_RANGE).to(torch.bfloat16)
    return tensors, experts


def save_and_reload_k3(spec: FixtureSpec, seed: int, directory: Path) -> k3_reference.K3ForCausalLM:
    """Writes directory/config.json and model.safetensors of a random K3 model and returns the fp32 reference that
    tools/k3_reference.py loads back from them; checks that it holds exactly the checkpoint's values."""
    config = make_k3_config(spec)
    torch.manual_seed(seed)
    model = k3_reference.K3ForCausalLM(k3_reference.TextConfig.from_dict(config["text_config"], k3=True))
    init_k3_weights(model, spec.init_std, spec.norm_std)
    tensors, experts = k3_checkpoint(model)
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, directory / WEIGHTS_FILE, metadata={"format": "pt"})
    reference = k3_reference.load_k3(directory)
    loaded = reference.state_dict()
    assert loaded.keys() == model.state_dict().keys()
    for name in loaded:  # bf16 / f32 tensors as saved; routed experts: dequantized == the values quantized
        expected = experts[name] if name in experts else tensors[k3_reference.TEXT_PREFIX + name].float()
        assert torch.equal(loaded[name], expected), f"{directory.name}: {name} differs from the checkpoint"
    return reference


def check_k3_rerun(directory: Path, references: list) -> None:
    """A fresh load of the written fixture reproduces every saved logits file exactly."""
    model = k3_reference.load_k3(directory)
    for i, reference in enumerate(references):
        logits = model(reference.ids + reference.greedy).numpy()
        assert np.array_equal(logits, np.load(directory / f"logits_{i}.npy")), f"{directory.name}: logits_{i} differ"


# ---------------------------------------------------------------------------------------------------------------------
# Reference outputs


def make_prompt(seed: int, length: int, vocab_size: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(FIRST_PROMPT_ID, vocab_size, (1, length), generator=generator)


def greedy_continuation(model: ReferenceModel, prompt: torch.Tensor) -> torch.Tensor:
    """NEW_TOKENS greedy ids from generate() with its cache (prefill, then recurrent single-token decode); for K3,
    from repeated full forwards of tools/k3_reference.py (it has no cache)."""
    if isinstance(model, k3_reference.K3ForCausalLM):
        return torch.tensor([k3_reference.greedy(model, prompt[0].tolist(), NEW_TOKENS)])
    output = model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, use_cache=True)
    continuation = output[:, prompt.shape[1] :]
    assert continuation.shape[1] == NEW_TOKENS, "generate() stopped early"
    return continuation


def route_margin(router: KimiLinearTopkRouter, hidden_states: torch.Tensor) -> float:
    """Smallest gap, over tokens, between the last selected and first rejected group (if grouped) and expert.

    Recomputes the router's selection scores: sigmoid(logits) + bias, experts of non-selected groups masked out.
    """
    num_experts, num_groups, top_k = router.num_experts, router.num_group, router.top_k
    logits = F.linear(hidden_states.reshape(-1, router.hidden_dim).float(), router.weight.float())
    choice = logits.sigmoid() + router.e_score_correction_bias
    margins = []
    if num_groups > 1:
        grouped = choice.view(-1, num_groups, num_experts // num_groups)
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
        ranked_groups = group_scores.sort(dim=-1, descending=True)
        margins.append(ranked_groups.values[:, router.topk_group - 1] - ranked_groups.values[:, router.topk_group])
        rejected_groups = ranked_groups.indices[:, router.topk_group :]
        choice = grouped.scatter(1, rejected_groups[..., None].expand(-1, -1, grouped.shape[-1]), float("-inf"))
        choice = choice.view(-1, num_experts)
    ranked = choice.sort(dim=-1, descending=True).values
    margins.append(ranked[:, top_k - 1] - ranked[:, top_k])
    return torch.cat(margins).min().item()


def one_pass(model: ReferenceModel, ids: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """One no-cache forward pass over ids [1, T]: logits [T, vocab] and hidden [num_layers + 1, T, hidden]."""
    if isinstance(model, k3_reference.K3ForCausalLM):
        logits, hidden = model(ids[0], output_hidden_states=True)
        return logits.numpy(), hidden.numpy()
    output = model(ids, use_cache=False, output_hidden_states=True)
    return output.logits[0].numpy(), torch.stack(output.hidden_states)[:, 0].numpy()


def forward_with_route_margin(model: ReferenceModel, ids: torch.Tensor):
    """One no-cache forward pass; returns its (logits, hidden), the min route margin over all MoE layers and tokens,
    and (K3) the AttnRes mixing weights of every mixing point with at least two candidates."""
    margins, attn_res_weights = [], []
    hooks = [
        module.register_forward_hook(lambda router, args, _: margins.append(route_margin(router, args[0])))
        for module in model.modules()
        if isinstance(module, KimiLinearTopkRouter)
    ]
    unrecorded = k3_reference.attn_res_weights

    def recorded(*args):
        weights = unrecorded(*args)
        if weights.shape[0] > 1:
            attn_res_weights.append(weights.reshape(weights.shape[0], -1))
        return weights

    k3_reference.attn_res_weights = recorded
    try:
        outputs = one_pass(model, ids)
    finally:
        k3_reference.attn_res_weights = unrecorded
        for hook in hooks:
            hook.remove()
    return outputs, min(margins, default=float("inf")), attn_res_weights


def top2_margins(logits: np.ndarray) -> np.ndarray:
    top2 = np.sort(logits, axis=-1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


@dataclasses.dataclass
class PromptReference:
    ids: list
    greedy: list  # generate() with its cache
    logits: np.ndarray  # [len(ids) + NEW_TOKENS, vocab] from one no-cache pass over ids + greedy
    hidden: np.ndarray  # [num_layers + 1, len(ids) + NEW_TOKENS, hidden] from that pass
    min_route_margin: float
    attn_res_weights: list  # K3: [candidates, tokens] softmax weights of each AttnRes mixing point (2+ candidates)

    @property
    def min_top2_margin(self) -> float:
        return float(top2_margins(self.logits).min())

    def greedy_argmax_mismatches(self) -> list:
        """New-token indices j where greedy[j] differs from the one-pass argmax and the top-2 margin there is clear."""
        positions = np.arange(len(self.ids) - 1, len(self.ids) - 1 + NEW_TOKENS)
        clear = top2_margins(self.logits[positions]) > ARGMAX_CHECK_MARGIN
        argmax = self.logits[positions].argmax(axis=-1)
        return [int(j) for j in np.flatnonzero(clear & (argmax != np.array(self.greedy)))]


def reference_outputs(model: ReferenceModel, prompt: torch.Tensor) -> PromptReference:
    greedy = greedy_continuation(model, prompt)
    with torch.no_grad():
        (logits, hidden), min_route_margin, attn_res_weights = forward_with_route_margin(
            model, torch.cat([prompt, greedy], dim=1)
        )
    return PromptReference(
        ids=prompt[0].tolist(),
        greedy=greedy[0].tolist(),
        logits=logits,
        hidden=hidden,
        min_route_margin=min_route_margin,
        attn_res_weights=attn_res_weights,
    )


# ---------------------------------------------------------------------------------------------------------------------
# Fixtures


def build_fixture(spec: FixtureSpec, directory: Path) -> tuple[int, list[PromptReference]]:
    """Tries seeds from spec.seed on until every prompt's route margin is at least MIN_ROUTE_MARGIN."""
    config = None if spec.k3 else make_config(spec)
    vocab_size = K3_TEXT_CONFIG["vocab_size"] if spec.k3 else config.vocab_size
    for seed in range(spec.seed, spec.seed + SEED_ATTEMPTS):
        if spec.k3:
            model = save_and_reload_k3(spec, seed, directory)
        else:
            model = save_and_reload(build_random_model(config, seed, spec.norm_std), directory)
        prompts = [make_prompt(seed * 10 + i, length, vocab_size) for i, length in enumerate(PROMPT_LENGTHS)]
        with torch.no_grad():
            margin = min(forward_with_route_margin(model, prompt)[1] for prompt in prompts)
        if margin < MIN_ROUTE_MARGIN:
            print(f"  {spec.name}: seed {seed} has min route margin {margin:.3g} < {MIN_ROUTE_MARGIN} (prompts), next")
            continue
        references = [reference_outputs(model, prompt) for prompt in prompts]
        margin = min(reference.min_route_margin for reference in references)
        if margin >= MIN_ROUTE_MARGIN:
            return seed, references
        print(f"  {spec.name}: seed {seed} has min route margin {margin:.3g} < {MIN_ROUTE_MARGIN}, next seed")
    raise RuntimeError(f"{spec.name}: no seed in {SEED_ATTEMPTS} attempts reaches the route margin")


K3_GOLDEN_NOTES = {
    "reference": "tools/k3_reference.py",
    "greedy_from": "repeated full no-cache forwards (argmax of the last row)",
    "hidden_layout": "[num_layers + 1, T, hidden]: entry 0 the embeddings, entry i + 1 the AttnRes running block "
    "sum P after layer i (MODEL.md 8.2); no final-norm entry",
}


def write_golden(directory: Path, seed: int, references: list[PromptReference], k3: bool = False) -> None:
    prompts = []
    for i, reference in enumerate(references):
        np.save(directory / f"logits_{i}.npy", reference.logits)
        np.save(directory / f"hidden_{i}.npy", reference.hidden)
        prompts.append(
            {
                "ids": reference.ids,
                "greedy": reference.greedy,
                "logits": f"logits_{i}.npy",
                "hidden": f"hidden_{i}.npy",
                "min_top2_margin": reference.min_top2_margin,
                "min_route_margin": reference.min_route_margin,
            }
        )
    golden = {
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "generator": "tools/make_golden.py",
        **(K3_GOLDEN_NOTES if k3 else {}),
        "seed": seed,
        "prompts": prompts,
    }
    (directory / "golden.json").write_text(json.dumps(golden, indent=2) + "\n")


def attn_res_summary(weights: list) -> str:
    """How far from uniform the AttnRes softmax is: its mean top weight against the mean of 1/candidates."""
    if not weights:
        return ""
    top = torch.cat([w.max(dim=0).values for w in weights]).mean().item()
    uniform = torch.cat([torch.full((w.shape[1],), 1.0 / w.shape[0]) for w in weights]).mean().item()
    return f"  AttnRes mean top weight {top:.3f} (uniform {uniform:.3f})"


def report(name: str, seed: int, reference: PromptReference) -> None:
    mismatches = reference.greedy_argmax_mismatches()
    print(
        f"  {name} seed {seed} prompt len {len(reference.ids):3d}: min_top2_margin {reference.min_top2_margin:.4f}"
        f"  min_route_margin {reference.min_route_margin:.2e}"
        f"  greedy vs one-pass argmax: {f'MISMATCH at new tokens {mismatches}' if mismatches else 'ok'}"
        f"{attn_res_summary(reference.attn_res_weights)}"
    )


def make_fixture(spec: FixtureSpec, out: Path) -> None:
    directory = out / spec.name
    seed, references = build_fixture(spec, directory)
    write_golden(directory, seed, references, k3=spec.k3)
    if spec.k3:
        check_k3_rerun(directory, references)
        print(f"  {spec.name}: a fresh load of the fixture reproduces its logits exactly")
    for reference in references:
        report(spec.name, seed, reference)
    mismatched = [len(r.ids) for r in references if r.greedy_argmax_mismatches()]
    assert not mismatched, f"{spec.name}: greedy != one-pass argmax at a clear margin (prompt lengths {mismatched})"
    if spec.moonshot_twin:
        make_moonshot_twin(directory, out / f"{spec.name}-moonshot")


# ---------------------------------------------------------------------------------------------------------------------
# Moonshot-style (Hub) config twin


def moonshot_config(config: KimiLinearConfig) -> dict:
    """The config.json the Hub writes for Kimi Linear (MODEL.md §2.1): 1-based layer lists, dense-first MoE."""
    first_k_dense = config.mlp_layer_types.index(MOE)
    assert config.mlp_layer_types == [DENSE] * first_k_dense + [MOE] * (config.num_hidden_layers - first_k_dense)

    def one_based_layers(kind: str) -> list:
        return [i + 1 for i, layer_type in enumerate(config.layer_types) if layer_type == kind]

    return {
        "architectures": ["KimiLinearForCausalLM"],
        "model_type": "kimi_linear",
        "dtype": "bfloat16",
        "tie_word_embeddings": config.tie_word_embeddings,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "hidden_act": config.hidden_act,
        "rms_norm_eps": config.rms_norm_eps,
        "model_max_length": config.model_max_length,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
        "linear_attn_config": {
            "kda_layers": one_based_layers(KDA),
            "full_attn_layers": one_based_layers(MLA),
            "num_heads": config.linear_num_heads,
            "head_dim": config.linear_head_dim,
            "short_conv_kernel_size": config.linear_conv_kernel_dim,
        },
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "q_lora_rank": config.q_lora_rank,
        "kv_lora_rank": config.kv_lora_rank,
        "qk_nope_head_dim": config.qk_nope_head_dim,
        "qk_rope_head_dim": config.qk_rope_head_dim,
        "v_head_dim": config.v_head_dim,
        "mla_use_nope": True,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "num_experts": config.num_experts,
        "num_experts_per_token": config.num_experts_per_token,
        "moe_intermediate_size": config.moe_intermediate_size,
        "num_shared_experts": config.num_shared_experts,
        "first_k_dense_replace": first_k_dense,
        "moe_layer_freq": 1,
        "moe_router_activation_func": "sigmoid",
        "use_grouped_topk": True,
        "num_expert_group": config.num_expert_group,
        "topk_group": config.topk_group,
        "moe_renormalize": config.moe_renormalize,
        "routed_scaling_factor": config.routed_scaling_factor,
        "head_dim": 72,  # what the Hub writes; not a model dimension
    }


PARSED_FIELDS = (
    "layer_types",
    "mlp_layer_types",
    "linear_num_heads",
    "linear_head_dim",
    "linear_conv_kernel_dim",
    "num_experts",
    "num_experts_per_token",
    "num_shared_experts",
    "num_expert_group",
    "topk_group",
    "moe_renormalize",
    "routed_scaling_factor",
    "q_lora_rank",
    "kv_lora_rank",
    "rms_norm_eps",
)


def make_moonshot_twin(source: Path, twin: Path) -> None:
    """Writes twin/config.json in Moonshot style next to a relative symlink to source's weights."""
    if twin.exists():
        shutil.rmtree(twin)
    twin.mkdir()
    config = KimiLinearConfig.from_pretrained(source)
    (twin / "config.json").write_text(json.dumps(moonshot_config(config), indent=2) + "\n")
    (twin / WEIGHTS_FILE).symlink_to(Path("..") / source.name / WEIGHTS_FILE)
    parsed = KimiLinearConfig.from_pretrained(twin)
    mismatched = [field for field in PARSED_FIELDS if getattr(parsed, field) != getattr(config, field)]
    assert not mismatched, f"transformers parses {twin.name} differently: {mismatched}"
    prompt = make_prompt(0, PROMPT_LENGTHS[1], config.vocab_size)
    with torch.no_grad():
        same_logits = torch.equal(load_reference(twin)(prompt).logits, load_reference(source)(prompt).logits)
    assert same_logits, f"{twin.name} and {source.name} give different logits"
    print(f"  {twin.name}: transformers parses it like {source.name}, same logits")


# ---------------------------------------------------------------------------------------------------------------------


def tree_size(directory: Path) -> int:
    """Bytes of the regular files under directory (symlinks are not counted twice)."""
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file() and not path.is_symlink())


def link_bundled_model() -> None:
    BUNDLED_MODEL.parent.mkdir(exist_ok=True)
    BUNDLED_MODEL.unlink(missing_ok=True)
    BUNDLED_MODEL.symlink_to(os.path.relpath(DEFAULT_OUT / FIXTURES[0].name, BUNDLED_MODEL.parent))


def check_pure_pytorch() -> None:
    """transformers dispatches KDA, the short conv and norms to these packages when they are installed."""
    installed = [name for name in OPTIONAL_KERNEL_PACKAGES if importlib.util.find_spec(name) is not None]
    assert not installed, f"uninstall {installed}: the reference must run the pure PyTorch paths"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="fixtures directory")
    parser.add_argument("--only", action="append", choices=[spec.name for spec in FIXTURES], help="fixture to build")
    args = parser.parse_args()
    out = args.out.resolve()
    check_pure_pytorch()
    transformers.utils.logging.disable_progress_bar()
    torch.use_deterministic_algorithms(True)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for spec in FIXTURES:
        if args.only is None or spec.name in args.only:
            make_fixture(spec, out)
    if out == DEFAULT_OUT:
        link_bundled_model()
    size = tree_size(out)
    print(f"{out}: {size / 2**20:.2f} MiB in all ({time.perf_counter() - start:.1f} s)")
    assert size < MAX_FIXTURES_BYTES, "fixtures exceed the size budget"


if __name__ == "__main__":
    main()
