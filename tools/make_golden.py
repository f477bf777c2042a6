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

How: each model is built with fixed seeds, saved in bf16 with save_pretrained, and reloaded in fp32 so the
reference computes in fp32 from exactly the weights in the file. It runs on CPU in pure PyTorch (eager attention,
eager experts; the `fla` / hub `kernels` packages must not be installed). The min_route_margin of a fixture (smallest
gap between the last selected and the first rejected expert or group) must be at least MIN_ROUTE_MARGIN, because
the engine computes the same router scores with a different summation order; a fixture whose margin is too small
is rebuilt with the next seed.

Rerun (takes well under a minute on CPU; the output is deterministic; with the default --out it also points the
bundled model models/kimi-linear-tiny at the first fixture):
    python3 tools/make_golden.py [--out tests/fixtures]
To add a fixture, append a FixtureSpec to FIXTURES.
"""

import argparse
import dataclasses
import importlib.util
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers import KimiLinearConfig, KimiLinearForCausalLM
from transformers.models.kimi_linear.modeling_kimi_linear import (
    KimiLinearRMSNorm,
    KimiLinearRMSNormGated,
    KimiLinearTopkRouter,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures"
BUNDLED_MODEL = REPO_ROOT / "models" / "kimi-linear-tiny"  # symlink to the first fixture
WEIGHTS_FILE = "model.safetensors"

PROMPT_LENGTHS = (1, 37, 150)  # 150 > 128 and not a multiple of the 64-token chunk
NEW_TOKENS = 24
FIRST_PROMPT_ID = 3  # prompts avoid pad (0), bos (1) and eos (2)
MIN_ROUTE_MARGIN = 1e-4
SEED_ATTEMPTS = 20
ARGMAX_CHECK_MARGIN = 1e-3
MAX_FIXTURES_BYTES = 12 * 1024 * 1024
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


@dataclasses.dataclass(frozen=True)
class FixtureSpec:
    name: str
    seed: int  # first seed tried; later ones are seed + 1, seed + 2, ... (see MIN_ROUTE_MARGIN)
    config: dict  # KimiLinearConfig arguments on top of COMMON_DIMS
    moonshot_twin: bool = False  # also write <name>-moonshot/ with a Hub-style config.json


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
]


def make_config(spec: FixtureSpec) -> KimiLinearConfig:
    return KimiLinearConfig(num_hidden_layers=len(spec.config["layer_types"]), **COMMON_DIMS, **spec.config)


# ---------------------------------------------------------------------------------------------------------------------
# Model: build, save in bf16, reload in fp32


def build_random_model(config: KimiLinearConfig, seed: int) -> KimiLinearForCausalLM:
    """transformers' init (with INITIALIZER_RANGE), then a spread-out router and random norm weights."""
    torch.manual_seed(seed)
    model = KimiLinearForCausalLM(config)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, KimiLinearTopkRouter):
                module.weight.normal_(0.0, ROUTER_WEIGHT_STD)
                module.e_score_correction_bias.normal_(0.0, ROUTER_BIAS_STD)
            elif isinstance(module, (KimiLinearRMSNorm, KimiLinearRMSNormGated)):
                module.weight.normal_(1.0, NORM_WEIGHT_STD)
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
# Reference outputs


def make_prompt(seed: int, length: int, vocab_size: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(FIRST_PROMPT_ID, vocab_size, (1, length), generator=generator)


def greedy_continuation(model: KimiLinearForCausalLM, prompt: torch.Tensor) -> torch.Tensor:
    """NEW_TOKENS greedy ids from generate() with its cache (prefill, then recurrent single-token decode)."""
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


def forward_with_route_margin(model: KimiLinearForCausalLM, ids: torch.Tensor):
    """One no-cache forward pass; returns its output and the min route margin over all MoE layers and tokens."""
    margins = []
    hooks = [
        module.register_forward_hook(lambda router, args, _: margins.append(route_margin(router, args[0])))
        for module in model.modules()
        if isinstance(module, KimiLinearTopkRouter)
    ]
    try:
        output = model(ids, use_cache=False, output_hidden_states=True)
    finally:
        for hook in hooks:
            hook.remove()
    return output, min(margins, default=float("inf"))


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

    @property
    def min_top2_margin(self) -> float:
        return float(top2_margins(self.logits).min())

    def greedy_argmax_mismatches(self) -> list:
        """New-token indices j where greedy[j] differs from the one-pass argmax and the top-2 margin there is clear."""
        positions = np.arange(len(self.ids) - 1, len(self.ids) - 1 + NEW_TOKENS)
        clear = top2_margins(self.logits[positions]) > ARGMAX_CHECK_MARGIN
        argmax = self.logits[positions].argmax(axis=-1)
        return [int(j) for j in np.flatnonzero(clear & (argmax != np.array(self.greedy)))]


def reference_outputs(model: KimiLinearForCausalLM, prompt: torch.Tensor) -> PromptReference:
    greedy = greedy_continuation(model, prompt)
    with torch.no_grad():
        output, min_route_margin = forward_with_route_margin(model, torch.cat([prompt, greedy], dim=1))
    return PromptReference(
        ids=prompt[0].tolist(),
        greedy=greedy[0].tolist(),
        logits=output.logits[0].numpy(),
        hidden=torch.stack(output.hidden_states)[:, 0].numpy(),
        min_route_margin=min_route_margin,
    )


# ---------------------------------------------------------------------------------------------------------------------
# Fixtures


def build_fixture(spec: FixtureSpec, directory: Path) -> tuple[int, list[PromptReference]]:
    """Tries seeds from spec.seed on until every prompt's route margin is at least MIN_ROUTE_MARGIN."""
    config = make_config(spec)
    for seed in range(spec.seed, spec.seed + SEED_ATTEMPTS):
        model = save_and_reload(build_random_model(config, seed), directory)
        references = [
            reference_outputs(model, make_prompt(seed * 10 + i, length, config.vocab_size))
            for i, length in enumerate(PROMPT_LENGTHS)
        ]
        margin = min(reference.min_route_margin for reference in references)
        if margin >= MIN_ROUTE_MARGIN:
            return seed, references
        print(f"  {spec.name}: seed {seed} has min route margin {margin:.3g} < {MIN_ROUTE_MARGIN}, next seed")
    raise RuntimeError(f"{spec.name}: no seed in {SEED_ATTEMPTS} attempts reaches the route margin")


def write_golden(directory: Path, seed: int, references: list[PromptReference]) -> None:
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
        "seed": seed,
        "prompts": prompts,
    }
    (directory / "golden.json").write_text(json.dumps(golden, indent=2) + "\n")


def report(name: str, seed: int, reference: PromptReference) -> None:
    mismatches = reference.greedy_argmax_mismatches()
    print(
        f"  {name} seed {seed} prompt len {len(reference.ids):3d}: min_top2_margin {reference.min_top2_margin:.4f}"
        f"  min_route_margin {reference.min_route_margin:.2e}"
        f"  greedy vs one-pass argmax: {f'MISMATCH at new tokens {mismatches}' if mismatches else 'ok'}"
    )


def make_fixture(spec: FixtureSpec, out: Path) -> None:
    directory = out / spec.name
    seed, references = build_fixture(spec, directory)
    write_golden(directory, seed, references)
    for reference in references:
        report(spec.name, seed, reference)
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
    out = parser.parse_args().out.resolve()
    check_pure_pytorch()
    transformers.utils.logging.disable_progress_bar()
    torch.use_deterministic_algorithms(True)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for spec in FIXTURES:
        make_fixture(spec, out)
    if out == DEFAULT_OUT:
        link_bundled_model()
    size = tree_size(out)
    print(f"{out}: {size / 2**20:.2f} MiB in all ({time.perf_counter() - start:.1f} s)")
    assert size < MAX_FIXTURES_BYTES, "fixtures exceed the size budget"


if __name__ == "__main__":
    main()
