"""Weight-only FP8 draft heads (eagle_triton.heads.fp8): quantisation, the product's definition, module casts,
checkpoints, the load option, attention biases of EAGLE-3 heads."""

import pytest
import torch

from eagle_triton.heads import DraftHeadConfig, Eagle3DraftHead, load_draft_head
from eagle_triton.heads.fp8 import FP8_MAX, Fp8Linear, apply_draft_dtype, fp8_linear, quantize_fp8_weight
from eagle_triton.testing import random_eagle1_head, random_eagle3_head


def test_quantize_fp8_weight_per_output_channel():
    """Scales are max|row| / 448 (1 for a zero row); every e4m3 value is finite, never the NaN encoding, and the
    dequantised weight is within half an e4m3 step (2**-4 relative for normals, 2**-10 x scale for subnormals)."""
    w = torch.randn(37, 53) * torch.rand(37, 1) * 10
    w[5] = 0.0
    w[7, 3] = 1e-6  # a row with a tiny maximum
    w8, s = quantize_fp8_weight(w)
    assert w8.dtype == torch.float8_e4m3fn and s.dtype == torch.float32 and s.shape == (37,)
    amax = w.abs().amax(1)
    torch.testing.assert_close(s[amax > 0], amax[amax > 0] / FP8_MAX, rtol=0, atol=0)
    assert float(s[5]) == 1.0 and not w8[5].float().any()
    bits = w8.view(torch.uint8)
    assert not ((bits & 0x7F) == 0x7F).any()  # no NaN encodings
    deq = w8.float() * s[:, None]
    err = (deq - w).abs()
    bound = torch.maximum(w.abs() * 2**-4, s[:, None] * 2**-10)
    assert (err <= bound).all()
    assert (w8.float().abs().amax(1)[amax > 0] == FP8_MAX).all()  # the largest entry maps to 448 exactly
    with pytest.raises(ValueError, match="inf or NaN"):
        quantize_fp8_weight(torch.tensor([[1.0, float("inf")]]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fp8_linear_is_the_documented_product(dtype):
    """rnd(rnd(x @ W8.T) * scale + bias), and Fp8Linear computes exactly fp8_linear."""
    lin = torch.nn.Linear(48, 20, bias=True)
    q = Fp8Linear.from_linear(lin).to(dtype)
    x = torch.randn(3, 5, 48).to(dtype)
    want = ((x @ q.weight.to(dtype).T) * q.weight_scale + q.bias).to(dtype)
    assert torch.equal(q(x), want)
    assert torch.equal(fp8_linear(x, q.weight, q.weight_scale, q.bias), want)
    # close to the unquantised layer (e4m3: 3 mantissa bits)
    ref = lin.to(dtype)(x).float()
    assert (q(x).float() - ref).abs().max() <= 0.1 * ref.abs().max()


def test_module_casts_keep_fp8_weights_and_fp32_scales():
    head = random_eagle3_head(seed=0).quantize_fp8()
    w8 = head.midlayer.mlp.down_proj.weight.clone()
    sc = head.midlayer.mlp.down_proj.weight_scale.clone()
    head.to(torch.bfloat16)
    assert head.dtype == torch.bfloat16 and head.is_fp8
    m = head.midlayer.mlp.down_proj
    assert m.weight.dtype == torch.float8_e4m3fn and m.weight_scale.dtype == torch.float32
    assert torch.equal(m.weight.view(torch.uint8), w8.view(torch.uint8)) and torch.equal(m.weight_scale, sc)
    head.half().float()
    assert torch.equal(head.midlayer.mlp.down_proj.weight_scale, sc)
    assert head.quantize_fp8() is head  # idempotent
    for name in Eagle3DraftHead.FP8_LAYERS:
        assert isinstance(head.get_submodule(name), Fp8Linear), name
    assert head.embed_tokens.weight.dtype == torch.float32  # embedding and norms stay in the model dtype


def test_fp8_head_forward_matches_dequantised_weights():
    """The quantised head equals the same head with every linear weight replaced by W8 * scale, in fp32 (the two
    differ only by where the scale multiplies: within fp32 rounding)."""
    head = random_eagle3_head(seed=1)
    q = random_eagle3_head(seed=1).quantize_fp8()
    with torch.no_grad():
        for name in Eagle3DraftHead.FP8_LAYERS:
            m = q.get_submodule(name)
            head.get_submodule(name).weight.copy_(m.weight.float() * m.weight_scale[:, None])
    x, ids = torch.randn(1, 6, head.feature_width), torch.randint(0, 256, (1, 6))
    a, _ = head(x, ids)
    b, _ = q(x, ids)
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(q.compute_logits(b), head.compute_logits(a), rtol=1e-5, atol=1e-5)


def test_fp8_checkpoints_and_the_load_option(tmp_path):
    head = random_eagle3_head(seed=2)
    head.save_pretrained(tmp_path / "bf", include_embeddings=True)
    loaded = load_draft_head(tmp_path / "bf", weight_dtype="fp8", dtype=torch.float16)
    direct = random_eagle3_head(seed=2).quantize_fp8()
    assert loaded.is_fp8 and loaded.dtype == torch.float16
    for name in Eagle3DraftHead.FP8_LAYERS:
        a, b = loaded.get_submodule(name), direct.get_submodule(name)
        assert torch.equal(a.weight.view(torch.uint8), b.weight.view(torch.uint8)) and torch.equal(
            a.weight_scale, b.weight_scale), name
    # an FP8 head saved and loaded back is FP8, bit for bit
    direct.save_pretrained(tmp_path / "f8", include_embeddings=True)
    again = Eagle3DraftHead.from_pretrained(tmp_path / "f8")
    assert again.is_fp8
    sd_a, sd_b = again.state_dict(), direct.state_dict()
    assert sd_a.keys() == sd_b.keys()
    for k in sd_a:
        assert sd_a[k].dtype == sd_b[k].dtype and torch.equal(sd_a[k].view(torch.uint8) if sd_a[k].dtype ==
                                                              torch.float8_e4m3fn else sd_a[k], sd_b[k].view(
            torch.uint8) if sd_b[k].dtype == torch.float8_e4m3fn else sd_b[k]), k
    with pytest.raises(ValueError, match="weight_dtype"):
        load_draft_head(tmp_path / "bf", weight_dtype="int4")
    e1 = random_eagle1_head(seed=0)
    e1.save_pretrained(tmp_path / "e1", include_embeddings=True)
    with pytest.raises(ValueError, match="EAGLE-3 heads only"):
        load_draft_head(tmp_path / "e1", weight_dtype="fp8")
    with pytest.raises(ValueError, match="EAGLE-3 heads only"):
        apply_draft_dtype(e1, "fp8")
    with pytest.raises(ValueError, match="draft dtype"):
        apply_draft_dtype(head, "fp4")
    assert apply_draft_dtype(head, "model") is head and not head.is_fp8


def test_attention_bias_config_and_checkpoint(tmp_path):
    """``attention_bias`` (Llama's field) gives an EAGLE-3 head q/k/v and o_proj biases, saved and loaded strictly;
    a checkpoint with biases does not load into a head without them."""
    cfg = DraftHeadConfig(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                          vocab_size=256, draft_vocab_size=96, attention_bias=True)
    head = random_eagle3_head(config=cfg, seed=4)
    at = head.midlayer.self_attn
    assert all(m.bias is not None and m.bias.abs().sum() > 0 for m in (at.q_proj, at.k_proj, at.v_proj, at.o_proj))
    head.save_pretrained(tmp_path / "b", include_embeddings=True)
    back = load_draft_head(tmp_path / "b")
    assert torch.equal(back.midlayer.self_attn.o_proj.bias, at.o_proj.bias)
    assert back.config.attention_bias is True
    import json

    cfg_path = tmp_path / "b" / "config.json"
    data = json.loads(cfg_path.read_text())
    data.pop("attention_bias")
    cfg_path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="unexpected key 'midlayer.self_attn.o_proj.bias'"):
        load_draft_head(tmp_path / "b")
