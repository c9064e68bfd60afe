"""Where the weights come from: a preset with random weights, a local checkpoint, or the Hugging Face hub.

``load_model(name)`` resolves ``name`` in this order:

1. a **preset** (``tiny``, ``qwen3-0.6b-random``, ``qwen3-8b-random``): a Qwen3 config written here and seeded
   random weights, so that demos, tests and GPU benchmarks run with no download. ``qwen3-0.6b-random`` and
   ``qwen3-8b-random`` have the real models' exact shapes, so their speed is the real models' speed (their
   tokens are noise, of course). The 8B preset is built on the device it runs on: 16 GB in bfloat16, 33 GB
   at the peak of building (float32 first); a device without that much free memory is refused;
2. a **local directory** holding ``config.json`` and ``*.safetensors`` (one file or shards);
3. a **hub id** such as ``Qwen/Qwen3-0.6B``, fetched with ``huggingface_hub`` into its usual cache.

transformers supplies only the config class; the weights are read with safetensors straight into our own
``Qwen3ForCausalLM``, whose parameter names match the checkpoint's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import Qwen3Config

from .model import Qwen3ForCausalLM

# Qwen3-0.6B's published shape (config.json of Qwen/Qwen3-0.6B).
QWEN3_0_6B_SHAPE = dict(
    vocab_size=151936,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    bos_token_id=151643,
    eos_token_id=151645,
)

# Qwen3-8B's published shape (config.json of Qwen/Qwen3-8B): the same vocabulary, untied embeddings.
QWEN3_8B_SHAPE = {**QWEN3_0_6B_SHAPE, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                  "num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": False}

PRESETS: dict[str, dict] = {
    # Small enough for a laptop CPU, but with the real vocabulary so the real tokenizer works with it.
    "tiny": {**QWEN3_0_6B_SHAPE, "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 8192},
    "qwen3-0.6b-random": dict(QWEN3_0_6B_SHAPE),
    "qwen3-8b-random": dict(QWEN3_8B_SHAPE),  # for where weights dominate a step (m13); ~8.2 billion parameters
}

# "org/name" (letters, digits, '-', '_', '.'): what a hub id looks like.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass
class LoadedModel:
    model: Qwen3ForCausalLM
    config: Qwen3Config
    checkpoint_dir: Path | None  # None for presets; also where a tokenizer may be found


def preset_config(name: str) -> Qwen3Config:
    return Qwen3Config(**PRESETS[name])


def resolve_checkpoint(name: str) -> Path:
    """Turn a local path or hub id into a directory holding ``config.json`` and safetensors files."""
    path = Path(name).expanduser()
    if path.is_dir():
        directory = path
    elif path.exists():
        raise ValueError(f"model {name!r} is a file; pass a checkpoint directory (config.json + *.safetensors)")
    elif _HUB_ID.match(name):
        directory = _download(name)
    else:
        raise ValueError(
            f"unknown model {name!r}: not a preset ({', '.join(PRESETS)}), not an existing directory, "
            "and not a Hugging Face hub id like 'Qwen/Qwen3-0.6B'"
        )
    if not (directory / "config.json").is_file():
        raise ValueError(f"checkpoint directory {str(directory)!r} has no config.json")
    if not list(directory.glob("*.safetensors")):
        raise ValueError(f"checkpoint directory {str(directory)!r} has no *.safetensors weights")
    return directory


def _download(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken"]
    try:
        return Path(snapshot_download(repo_id=repo_id, allow_patterns=patterns))
    except Exception as error:  # network down, repo missing, gated repo: all mean "cannot load this"
        # One line is the whole story for the user; the hub's chained traceback (~100 lines) is not.
        raise ValueError(
            f"could not fetch model {repo_id!r} from the Hugging Face hub ({_one_line(error)}). "
            "Without network access, pass a local checkpoint directory or a preset "
            f"({', '.join(PRESETS)})"
        ) from None


def _one_line(error: Exception) -> str:
    """``"TypeName: first line of the message"``: hub errors often add paragraphs of advice below it."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def parameter_count(config: Qwen3Config) -> int:
    """Parameters of a Qwen3 dense model of this shape: embeddings (and an untied head), layers, norms."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    h, q, kv = config.hidden_size, config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * config.intermediate_size + 2 * h + 2 * head_dim
    embeddings = config.vocab_size * h * (1 if config.tie_word_embeddings else 2)
    return embeddings + config.num_hidden_layers * per_layer + h


def check_preset_fits(name: str, config: Qwen3Config, device: torch.device, dtype: torch.dtype) -> None:
    """Refuse, in one line, a preset whose build would not fit: ``build_model`` makes float32 weights (then casts
    them one tensor at a time). Only a device that can say how much memory it has free is checked (CUDA, Linux's
    RAM)."""
    needed = parameter_count(config) * 4
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        try:
            import os

            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            return
    if needed > free:
        raise ValueError(f"preset {name!r} needs about {needed / 2**30:.1f} GiB to build on {device} (its "
                         f"weights in float32 first), but only {free / 2**30:.1f} GiB are free there")


def build_model(config: Qwen3Config, device: torch.device, dtype: torch.dtype) -> Qwen3ForCausalLM:
    if getattr(config, "model_type", "qwen3") != "qwen3":
        raise ValueError(f"this engine runs Qwen3 dense models; the checkpoint is {config.model_type!r}")
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    return model.to(dtype).eval().requires_grad_(False)


def init_random_(model: Qwen3ForCausalLM, seed: int, std: float = 0.02) -> None:
    """Seeded N(0, std) for matrices, ones for norm weights: what transformers' initialiser does for Qwen3."""
    generator = torch.Generator(device=model.lm_head.weight.device).manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        else:
            param.normal_(0.0, std, generator=generator)


def load_safetensors_(model: Qwen3ForCausalLM, directory: Path) -> None:
    """Copy every tensor of every ``*.safetensors`` shard into the parameter of the same name."""
    params = dict(model.named_parameters())
    tied = model.config.tie_word_embeddings
    loaded: set[str] = set()
    for shard in sorted(directory.glob("*.safetensors")):
        for name, tensor in load_file(str(shard)).items():
            if tied and name == "lm_head.weight":
                continue  # tied: the embedding matrix already is the head
            if name not in params:
                raise ValueError(f"{shard.name}: unexpected tensor {name!r} for a Qwen3 model")
            if params[name].shape != tensor.shape:
                raise ValueError(
                    f"{shard.name}: {name!r} has shape {tuple(tensor.shape)}, "
                    f"config.json implies {tuple(params[name].shape)}"
                )
            params[name].copy_(tensor)
            loaded.add(name)
    expected = {n for n in params if not (tied and n == "lm_head.weight")}
    missing = sorted(expected - loaded)
    if missing:
        raise ValueError(f"checkpoint {str(directory)!r} lacks {len(missing)} tensors, e.g. {missing[:3]}")


def load_model(name: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> LoadedModel:
    """Build ``Qwen3ForCausalLM`` from a preset, a local checkpoint directory or a hub id."""
    with torch.no_grad():
        if name in PRESETS:
            config = preset_config(name)
            check_preset_fits(name, config, device, dtype)
            model = build_model(config, device, dtype)
            init_random_(model, seed, std=config.initializer_range)
            return LoadedModel(model, config, None)
        directory = resolve_checkpoint(name)
        config = Qwen3Config.from_pretrained(directory)
        model = build_model(config, device, dtype)
        load_safetensors_(model, directory)
        return LoadedModel(model, config, directory)
