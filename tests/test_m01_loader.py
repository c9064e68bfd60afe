"""m01's loader: safetensors checkpoints (one file and sharded) give transformers' logits, presets have the
right shapes and seeded weights, the hub path works without network (mocked), and bad input is a ValueError.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from conftest import NORM_WEIGHT_RANGE, VOCAB, norm_weights, save_tiny_checkpoint
from safetensors.torch import load_file, save_file

from milestones.m01_naive_loop import loader
from milestones.m01_naive_loop.attention import CausalAttention
from milestones.m01_naive_loop.loader import load_model, preset_config
from milestones.m01_naive_loop.model import rope_theta

CPU, F32 = torch.device("cpu"), torch.float32


def load(name, **kwargs):
    return load_model(str(name), CPU, F32, **kwargs)


def batch_ids(batch: int = 3, length: int = 17, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def our_logits(model, ids: torch.Tensor) -> torch.Tensor:
    positions = torch.arange(ids.shape[1])[None, :].expand_as(ids)
    with torch.no_grad():
        return model.compute_logits(model(ids, positions, CausalAttention()))


def hf_logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits.float()


def assert_same_weights(ours, hf_model):
    ours_params = dict(ours.named_parameters())
    for name, tensor in hf_model.state_dict().items():
        if name in ours_params:
            torch.testing.assert_close(ours_params[name], tensor, rtol=0, atol=0, msg=name)


# --------------------------------------------------------------------------- checkpoints


def test_single_file_checkpoint_matches_transformers(tiny_checkpoint):
    directory, hf_model = tiny_checkpoint
    assert [p.name for p in directory.glob("*.safetensors")] == ["model.safetensors"]
    loaded = load(directory)
    assert loaded.checkpoint_dir == directory
    assert loaded.config.tie_word_embeddings == hf_model.config.tie_word_embeddings
    model = loaded.model
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    if hf_model.config.tie_word_embeddings:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    else:
        assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    assert_same_weights(model, hf_model)
    ids = batch_ids()
    torch.testing.assert_close(our_logits(model, ids), hf_logits(hf_model, ids))


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def sharded_checkpoint(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp("sharded")
    hf_model = save_tiny_checkpoint(directory, tie_word_embeddings=request.param, seed=7, max_shard_size="50KB")
    return directory, hf_model


def test_sharded_checkpoint_matches_transformers(sharded_checkpoint):
    directory, hf_model = sharded_checkpoint
    shards = sorted(p.name for p in directory.glob("*.safetensors"))
    assert len(shards) >= 3
    assert all(re.fullmatch(r"model-\d{5}-of-\d{5}\.safetensors", name) for name in shards)
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    model = load(directory).model
    assert_same_weights(model, hf_model)
    ids = batch_ids(batch=2, length=23, seed=1)
    torch.testing.assert_close(our_logits(model, ids), hf_logits(hf_model, ids))


def test_logits_depend_on_the_checkpoint(tiny_checkpoint, tmp_path):
    """The comparisons above are not vacuous: a checkpoint with another seed gives other logits."""
    other = save_tiny_checkpoint(tmp_path, tie_word_embeddings=tiny_checkpoint[1].config.tie_word_embeddings, seed=3)
    ids = batch_ids()
    ours = our_logits(load(tiny_checkpoint[0]).model, ids)
    assert (ours - hf_logits(other, ids)).abs().max() > 1e-3


def test_test_models_have_random_norm_weights(tiny_checkpoint):
    """Norm weights of 1.0 would hide an RMSNorm that ignores its weight, or q_norm and k_norm swapped."""
    directory, hf_model = tiny_checkpoint
    weights = norm_weights(hf_model)
    layers = hf_model.config.num_hidden_layers
    assert len(weights) == 4 * layers + 1  # input, post-attention, q_norm, k_norm per layer; the final norm
    low, high = NORM_WEIGHT_RANGE
    for name, weight in weights.items():
        assert low <= weight.min() and weight.max() <= high, name
        assert weight.std() > 0.1, f"{name} is nearly constant"
    per_head = [w for name, w in weights.items() if name.endswith(("q_norm.weight", "k_norm.weight"))]
    assert len({tuple(w.tolist()) for w in per_head}) == len(per_head)  # every q_norm and k_norm its own draw
    assert_same_weights(load(directory).model, hf_model)  # and the checkpoint carries them


# --------------------------------------------------------------------------- presets


def test_qwen3_0_6b_preset_has_the_published_shape():
    config = preset_config("qwen3-0.6b-random")  # only the config: building 0.6B random weights is too slow here
    assert config.vocab_size == 151936
    assert config.hidden_size == 1024
    assert config.num_hidden_layers == 28
    assert config.num_attention_heads == 16
    assert config.num_key_value_heads == 8
    assert config.head_dim == 128
    assert config.intermediate_size == 3072
    assert rope_theta(config) == 1_000_000.0
    assert config.rms_norm_eps == 1e-6
    assert config.tie_word_embeddings is True
    assert config.model_type == "qwen3"


def test_tiny_preset_is_small_with_the_real_vocabulary():
    config = preset_config("tiny")
    assert config.vocab_size == 151936  # so the real Qwen3 tokenizer works with it
    assert config.num_hidden_layers < 28 and config.hidden_size < 1024


def test_tiny_preset_weights_are_seeded():
    a, a_again, b = load("tiny", seed=0), load("tiny", seed=0), load("tiny", seed=1)
    assert a.checkpoint_dir is None
    a_params, b_params = dict(a.model.named_parameters()), dict(b.model.named_parameters())
    for name, tensor in a_again.model.named_parameters():
        assert torch.equal(a_params[name], tensor), name
        if name.endswith("norm.weight"):
            assert torch.equal(tensor, torch.ones_like(tensor)), name
        else:
            assert not torch.equal(b_params[name], tensor), name
            assert 0.01 < tensor.std().item() < 0.04, name  # N(0, 0.02)
    ids = torch.tensor([[9707, 1879, 0, 151645]])
    assert (our_logits(a.model, ids) - our_logits(b.model, ids)).abs().max() > 1e-4


# --------------------------------------------------------------------------- errors


def test_nonexistent_path(tmp_path):
    name = str(tmp_path / "no_such_checkpoint")
    with pytest.raises(ValueError, match=re.escape(repr(name))):
        load(name)


def test_unknown_preset_name():
    with pytest.raises(ValueError, match="tiny-typo") as info:
        load("tiny-typo")
    assert "qwen3-0.6b-random" in str(info.value)  # lists the presets


def test_path_to_a_file(tmp_path):
    (tmp_path / "weights.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="is a file"):
        load(tmp_path / "weights.safetensors")


def test_directory_without_config(tiny_checkpoint, tmp_path):
    shutil.copy(tiny_checkpoint[0] / "model.safetensors", tmp_path)
    with pytest.raises(ValueError, match="config.json"):
        load(tmp_path)


def test_directory_without_safetensors(tiny_checkpoint, tmp_path):
    shutil.copy(tiny_checkpoint[0] / "config.json", tmp_path)
    with pytest.raises(ValueError, match="safetensors"):
        load(tmp_path)


def edited_checkpoint(source, target, edit):
    """Copy ``source`` to ``target`` with ``edit(tensors)`` applied to its (single) safetensors file."""
    shutil.copytree(source, target)
    tensors = load_file(str(target / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target


def test_checkpoint_missing_a_tensor(tiny_checkpoint, tmp_path):
    directory = edited_checkpoint(tiny_checkpoint[0], tmp_path / "ckpt",
                                  lambda t: t.pop("model.layers.1.self_attn.k_norm.weight"))
    with pytest.raises(ValueError, match="model.layers.1.self_attn.k_norm.weight"):
        load(directory)


def test_untied_checkpoint_missing_lm_head(tmp_path):
    save_tiny_checkpoint(tmp_path / "src", tie_word_embeddings=False)
    directory = edited_checkpoint(tmp_path / "src", tmp_path / "ckpt", lambda t: t.pop("lm_head.weight"))
    with pytest.raises(ValueError, match="lm_head.weight"):
        load(directory)


def test_checkpoint_with_a_wrong_shape(tiny_checkpoint, tmp_path):
    name = "model.layers.0.mlp.up_proj.weight"

    def edit(tensors):
        tensors[name] = torch.zeros(tensors[name].shape[0] + 1, tensors[name].shape[1])

    directory = edited_checkpoint(tiny_checkpoint[0], tmp_path / "ckpt", edit)
    with pytest.raises(ValueError, match=re.escape(name)):
        load(directory)


def test_checkpoint_with_an_unexpected_tensor(tiny_checkpoint, tmp_path):
    directory = edited_checkpoint(tiny_checkpoint[0], tmp_path / "ckpt",
                                  lambda t: t.update({"model.layers.9.mlp.up_proj.weight": torch.zeros(2, 2)}))
    with pytest.raises(ValueError, match="unexpected"):
        load(directory)


def test_non_qwen3_checkpoint(tiny_checkpoint, tmp_path):
    shutil.copytree(tiny_checkpoint[0], tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    config["model_type"] = "llama"
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="Qwen3.*'llama'"):
        load(tmp_path / "ckpt")


# --------------------------------------------------------------------------- the hub, without network

HUB_ID = "nanoserve-test-org/no-such-model"


def test_hub_failure_is_a_value_error(monkeypatch, tmp_path):
    import huggingface_hub

    def offline(**kwargs):
        raise OSError("network is unreachable")

    monkeypatch.chdir(tmp_path)  # so HUB_ID cannot be a local directory
    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(ValueError, match="hub") as info:
        load(HUB_ID)
    assert HUB_ID in str(info.value) and "network is unreachable" in str(info.value)


def test_hub_failure_is_one_line_without_the_chained_traceback(monkeypatch, tmp_path):
    """The hub's own errors run to paragraphs and a ~100-line chain; the user gets their first line only."""
    import huggingface_hub

    def offline(**kwargs):
        raise OSError("Cannot reach the hub: name resolution failed\n\nAn error happened while trying to locate "
                      "the files on the Hub. Please check your internet connection and try again.")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(ValueError) as info:
        load(HUB_ID)
    message = str(info.value)
    assert "\n" not in message and "OSError: Cannot reach the hub: name resolution failed" in message
    assert "check your internet connection" not in message
    assert info.value.__cause__ is None and info.value.__suppress_context__  # raised "from None": no chain


def test_hub_download_loads_the_snapshot(monkeypatch, tmp_path, tiny_checkpoint):
    import huggingface_hub

    directory, hf_model = tiny_checkpoint
    calls = []

    def fake_snapshot_download(repo_id, allow_patterns=None, **kwargs):
        calls.append((repo_id, allow_patterns))
        return str(directory)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    loaded = load(HUB_ID)
    assert [repo for repo, _ in calls] == [HUB_ID]
    assert "*.safetensors" in calls[0][1] and "*.json" in calls[0][1]
    assert loaded.checkpoint_dir == directory
    ids = batch_ids(batch=1)
    torch.testing.assert_close(our_logits(loaded.model, ids), hf_logits(hf_model, ids))


def test_hub_snapshot_without_weights(monkeypatch, tmp_path, tiny_checkpoint):
    import huggingface_hub

    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    shutil.copy(tiny_checkpoint[0] / "config.json", snapshot)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda **kwargs: str(snapshot))
    with pytest.raises(ValueError, match="safetensors"):
        load(HUB_ID)


def test_local_directory_wins_over_hub(monkeypatch, tmp_path, tiny_checkpoint):
    """An existing directory named like a hub id is loaded from disk; the hub is never asked."""
    import huggingface_hub

    local = tmp_path / "org" / "name"
    shutil.copytree(tiny_checkpoint[0], local)

    def must_not_be_called(**kwargs):
        raise AssertionError("the hub was asked for a local directory")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", must_not_be_called)
    loaded = load_model("org/name", CPU, F32)
    assert loaded.checkpoint_dir.resolve() == local.resolve()


def test_presets_are_listed():
    assert {"tiny", "qwen3-0.6b-random"} <= set(loader.PRESETS)
