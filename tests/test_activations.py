"""Forward-hook capture of layer inputs (acetools.files.activations) on a tiny open_clip ViT and plain modules."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from acetools.files.activations import capture_inputs, gram_matrices, input_covariances, layer_input_spec

open_clip_transformer = pytest.importorskip("open_clip.transformer")

BLOCK = "transformer.resblocks.{i}."


def tiny_vit(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    m = open_clip_transformer.VisionTransformer(
        image_size=16, patch_size=4, width=16, layers=2, heads=2, mlp_ratio=4.0, output_dim=8
    )
    # non-trivial LayerNorm parameters so ln outputs differ from plain standardisation
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
    return m.eval()


def manual_layer_inputs(m: nn.Module, images: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Recompute each block's layer inputs by hand; also return the model output from them."""
    out = {}
    with torch.no_grad():
        x = m._embeds(images)  # (B, L, D): batch_first
        for i, blk in enumerate(m.transformer.resblocks):
            q = blk.ln_1(x)
            out[BLOCK.format(i=i) + "attn.in_proj_weight"] = q.reshape(-1, q.shape[-1])
            x = x + blk.attn(q, q, q, need_weights=False)[0]
            h = blk.ln_2(x)
            out[BLOCK.format(i=i) + "mlp.c_fc.weight"] = h.reshape(-1, h.shape[-1])
            g = blk.mlp.gelu(blk.mlp.c_fc(h))
            out[BLOCK.format(i=i) + "mlp.c_proj.weight"] = g.reshape(-1, g.shape[-1])
            x = x + blk.mlp.c_proj(g)
        pooled, _ = m._pool(x)
        final = pooled @ m.proj
    return out, final


def _n_hooks(model: nn.Module) -> int:
    return sum(len(mod._forward_pre_hooks) + len(mod._forward_hooks) for mod in model.modules())


KEYS = [BLOCK.format(i=i) + s
        for i in range(2) for s in ("attn.in_proj_weight", "mlp.c_fc.weight", "mlp.c_proj.weight")]


def test_vit_capture_matches_manual_forward():
    m = tiny_vit()
    images = torch.randn(5, 3, 16, 16)
    manual, final = manual_layer_inputs(m, images)
    with torch.no_grad():
        assert torch.allclose(final, m(images), atol=1e-5), "manual forward does not reproduce the model"
    got = capture_inputs(m, images, KEYS, batch_size=2)
    n_tokens = 5 * (1 + 16)
    for key in KEYS:
        d_in = 64 if key.endswith("c_proj.weight") else 16
        assert got[key].shape == (n_tokens, d_in), key
        torch.testing.assert_close(got[key], manual[key], atol=1e-5, rtol=1e-5)
    # the c_fc input is the ln_2 output, not the block input: different from the in_proj input
    assert not torch.allclose(got[KEYS[1]], got[KEYS[0]], atol=1e-3)
    assert _n_hooks(m) == 0


def test_batching_and_iterables_give_the_same_rows():
    m = tiny_vit(1)
    images = torch.randn(5, 3, 16, 16)
    whole = capture_inputs(m, images, KEYS[:2])
    chunked = capture_inputs(m, images, KEYS[:2], batch_size=3)
    loader = [(images[:4], torch.zeros(4)), (images[4:], torch.zeros(1))]
    from_loader = capture_inputs(m, loader, KEYS[:2])
    for key in KEYS[:2]:
        torch.testing.assert_close(chunked[key], whole[key], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(from_loader[key], whole[key], atol=1e-5, rtol=1e-5)


def test_prefix_strips_state_dict_names():
    m = tiny_vit(2)
    images = torch.randn(2, 3, 16, 16)
    key = "visual." + KEYS[1]
    got = capture_inputs(m, images, [key], prefix="visual.")
    assert list(got) == [key]
    torch.testing.assert_close(got[key], capture_inputs(m, images, [KEYS[1]])[KEYS[1]])


def test_plain_linear_and_hooks_removed():
    torch.manual_seed(0)
    lin = nn.Linear(6, 3)
    x = torch.randn(4, 7, 6)  # leading dims are flattened into rows
    got = capture_inputs(lin, x, ["weight"])
    assert torch.equal(got["weight"], x.reshape(-1, 6))
    assert _n_hooks(lin) == 0


def test_hooks_removed_when_forward_raises():
    class Boom(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            self.lin(x)
            raise RuntimeError("boom")

    m = Boom()
    with pytest.raises(RuntimeError, match="boom"):
        capture_inputs(m, torch.randn(2, 4), ["lin.weight"])
    assert _n_hooks(m) == 0


def test_eval_mode_is_used_and_restored():
    seen = []

    class Probe(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            seen.append(self.training)
            return self.lin(x)

    m = Probe().train()
    capture_inputs(m, torch.randn(2, 3), ["lin.weight"])
    assert seen == [False] and m.training and m.lin.training
    capture_inputs(m, torch.randn(2, 3), ["lin.weight"], eval_mode=False)
    assert seen[-1] is True


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_query_rows_are_batch_major(batch_first):
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(8, 2, batch_first=batch_first)

        def forward(self, q, kv):
            return self.attn(q, kv, kv, need_weights=False)[0]

    net = Net().eval()
    B, L = 3, 5
    q_bld = torch.randn(B, L, 8)
    kv_bld = torch.randn(B, L, 8)
    q = q_bld if batch_first else q_bld.transpose(0, 1)
    kv = kv_bld if batch_first else kv_bld.transpose(0, 1)

    # a wrapper whose forward takes the pair, so capture_inputs can run it on one tensor
    class Pair(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, z):
            return self.inner(z[0], z[1])

    got = capture_inputs(Pair(net), [torch.stack([q, kv])], ["inner.attn.in_proj_weight"])
    # the query is captured (not key/value), one row per (sample, token), sample-major
    assert torch.equal(got["inner.attn.in_proj_weight"], q_bld.reshape(-1, 8))


def test_gram_and_covariance_match_the_rows():
    m = tiny_vit(3)
    images = torch.randn(6, 3, 16, 16)
    keys = KEYS[1:3]
    X = capture_inputs(m, images, keys)
    G = gram_matrices(m, images, keys, batch_size=4)  # uneven batches: 4 + 2
    C = input_covariances(m, images, keys, batch_size=4)
    C1 = input_covariances(m, images, keys, batch_size=4, unbiased=True)
    for key in keys:
        x = X[key].double()
        n = x.shape[0]
        torch.testing.assert_close(G[key], x.T @ x / n, atol=1e-6, rtol=1e-6)
        xc = x - x.mean(0)
        torch.testing.assert_close(C[key], xc.T @ xc / n, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(C1[key], torch.cov(x.T), atol=1e-6, rtol=1e-6)
        assert G[key].dtype == torch.float64
    assert _n_hooks(m) == 0


def test_covariance_is_centred_and_gram_is_not():
    lin = nn.Linear(2, 1)
    x = torch.tensor([[1.0, 5.0], [3.0, 5.0]])  # mean (2, 5)
    G = gram_matrices(lin, x, ["weight"])["weight"]
    C = input_covariances(lin, x, ["weight"])["weight"]
    torch.testing.assert_close(G, torch.tensor([[5.0, 10.0], [10.0, 25.0]], dtype=torch.float64))
    torch.testing.assert_close(C, torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=torch.float64))


def test_bad_keys_and_inputs():
    m = tiny_vit(4)
    images = torch.randn(1, 3, 16, 16)
    with pytest.raises(KeyError, match="resblocks.7"):
        capture_inputs(m, images, ["transformer.resblocks.7.mlp.c_fc.weight"])
    with pytest.raises(KeyError, match="no parameter"):
        capture_inputs(m, images, ["transformer.resblocks.0.mlp.c_fc.scale"])
    with pytest.raises(KeyError, match="out_proj"):
        capture_inputs(m, images, ["transformer.resblocks.0.attn.out_proj_weight"])
    with pytest.raises(KeyError, match="prefix"):
        capture_inputs(m, images, [KEYS[0]], prefix="visual.")
    with pytest.raises(TypeError, match="single string"):
        capture_inputs(m, images, KEYS[0])
    with pytest.raises(ValueError, match="empty"):
        capture_inputs(m, images, [])
    with pytest.raises(ValueError, match="no batch"):
        capture_inputs(m, [], [KEYS[0]])
    with pytest.raises(ValueError, match="batch_size"):
        capture_inputs(m, images, [KEYS[0]], batch_size=0)
    # MultiheadAttention's out_proj is never called as a module: say so instead of returning nothing
    with pytest.raises(RuntimeError, match="out_proj"):
        capture_inputs(m, images, ["transformer.resblocks.0.attn.out_proj.weight"])
    with pytest.raises(ValueError, match="at least 2"):
        input_covariances(nn.Linear(2, 1), torch.randn(1, 2), ["weight"], unbiased=True)
    assert _n_hooks(m) == 0


def test_layer_input_spec_resolves_attention_inputs():
    m = tiny_vit(5)
    name, module, idx = layer_input_spec(m, KEYS[0])
    assert name == "transformer.resblocks.0.attn" and isinstance(module, nn.MultiheadAttention) and idx == 0
    name, module, idx = layer_input_spec(m, KEYS[2])
    assert name == "transformer.resblocks.0.mlp.c_proj" and idx == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_capture_on_cuda_returns_cpu_rows():
    m = tiny_vit(6).cuda()
    images = torch.randn(2, 3, 16, 16)
    got = capture_inputs(m, images, KEYS[:2])
    ref = capture_inputs(m.cpu(), images, KEYS[:2])
    for k in KEYS[:2]:
        assert got[k].device.type == "cpu"
        torch.testing.assert_close(got[k], ref[k], atol=1e-4, rtol=1e-4)


def test_token_statistics_split_the_energy_and_centre_per_position():
    import torch

    from acetools.files.activations import token_statistics

    g = torch.Generator().manual_seed(0)
    n, L, d = 50, 5, 6
    mean = torch.tensor([3.0, 0, 0, 0, 0, 0])
    pos = torch.zeros(L, d)
    pos[:, 1] = torch.arange(L, dtype=torch.float64) - 2.0  # a positional component on dimension 1
    noise = torch.randn(n, L, d, generator=g, dtype=torch.float64) * torch.tensor([0, 0, 1.0, 0.5, 0, 0])
    x = mean + pos + noise
    st = token_statistics(x.reshape(n * L, d), n)
    total = float(x.pow(2).sum(-1).mean())
    assert st.n_tokens == L
    assert st.mean_share + st.pos_share + st.resid_share == pytest.approx(1.0, rel=1e-12)  # exact decomposition
    assert st.mean_share == pytest.approx(float(x.reshape(-1, d).mean(0).pow(2).sum()) / total)
    # the centred Gram keeps only the per-sample part, on the patch tokens: dims 2 and 3
    c = st.centred
    assert float(c[0, 0]) == pytest.approx(0.0, abs=1e-12) and float(c[1, 1]) == pytest.approx(0.0, abs=1e-12)
    assert float(c[2, 2]) > 0.5 and float(c[3, 3]) > 0.1
    # the raw Gram is RegMean's (1/N) XᵀX and carries the shared mean and positions
    X = x.reshape(n * L, d)
    assert torch.allclose(st.raw, X.T @ X / (n * L))
    assert float(st.raw[0, 0]) == pytest.approx(9.0) and st.cls_share == pytest.approx(
        float(x[:, 0].pow(2).sum(-1).mean()) / L / total)
    with pytest.raises(ValueError, match="blocks of tokens"):
        token_statistics(X[:-1], n)


def test_padding_tokens_are_not_rows():
    """A tokenizer's batch with padding: the attention mask selects the rows (one per real token),
    and they equal each text's rows run alone without padding; mask_padding=False keeps every token."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=24, max_position_embeddings=16)
    model = transformers.BertModel(cfg).eval()
    keys = ["encoder.layer.0.attention.self.query.weight", "encoder.layer.0.intermediate.dense.weight"]
    lengths = (3, 6, 2)
    ids = torch.zeros(3, 6, dtype=torch.long)
    mask = torch.zeros(3, 6, dtype=torch.long)
    g = torch.Generator().manual_seed(1)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(1, 40, (n,), generator=g)
        mask[i, :n] = 1
    got = capture_inputs(model, {"input_ids": ids, "attention_mask": mask}, keys)
    alone = [capture_inputs(model, {"input_ids": ids[i:i + 1, :n], "attention_mask": mask[i:i + 1, :n]}, keys)
             for i, n in enumerate(lengths)]
    for k in keys:
        assert got[k].shape == (sum(lengths), 16)
        torch.testing.assert_close(got[k], torch.cat([a[k] for a in alone]), rtol=1e-5, atol=1e-5)
    every = capture_inputs(model, {"input_ids": ids, "attention_mask": mask}, keys, mask_padding=False)
    assert every[keys[0]].shape == (18, 16)
    G = gram_matrices(model, {"input_ids": ids, "attention_mask": mask}, keys[:1])[keys[0]]
    X = got[keys[0]].double()
    torch.testing.assert_close(G, X.T @ X / X.shape[0])
