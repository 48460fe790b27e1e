"""The fused drafter's FP8 -> bf16 weight conversion (``kernel._wcast``): the PTX sequence it runs on the GPU.

The interpreter cannot execute inline PTX, so on the CPU the sequence itself is executed by a small emulator of its
five instructions (``mov``, ``prmt``, ``shr``, ``and``, ``lop3``, ``mul.rn.bf16x2``), for every byte in every position
of the packed word, against PyTorch's e4m3 -> bf16 conversion. On a GPU the jitted helper is compared the same way.
"""

from __future__ import annotations

import re

import pytest
import torch

from eagle_triton.fused import kernel as K


def _bf16_bits_to_float(bits: int) -> float:
    return torch.tensor([bits], dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float().item()


def _float_to_bf16_bits(x: float) -> int:
    return torch.tensor([x], dtype=torch.float64).to(torch.bfloat16).view(torch.int16).item() & 0xFFFF


def _run_ptx(asm: str, word: int) -> tuple[int, int]:
    """Execute the conversion's PTX on one packed 32-bit input ``$2``; returns (``$0``, ``$1``)."""
    regs = {"$2": word}

    def val(tok: str) -> int:
        tok = tok.strip()
        return int(tok, 16) if tok.startswith("0x") else int(tok) if tok.isdigit() else regs[tok]

    for line in asm.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, _, rest = line.partition(" ")
        d, *args = [a.strip() for a in rest.split(",")]
        a = [val(x) for x in args]
        if op == "mov.b32":
            r = a[0]
        elif op == "prmt.b32":
            assert not a[2] & 0x8888, "sign-replicating prmt modes are not emulated"
            src = (a[1] << 32) | a[0]
            r = sum(((src >> (8 * ((a[2] >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))
        elif op == "shr.b32":
            r = a[0] >> a[1]
        elif op == "and.b32":
            r = a[0] & a[1]
        elif op == "lop3.b32":
            r = 0
            for bit in range(32):
                idx = (((a[0] >> bit) & 1) << 2) | (((a[1] >> bit) & 1) << 1) | ((a[2] >> bit) & 1)
                r |= ((a[3] >> idx) & 1) << bit
        elif op == "mul.rn.bf16x2":
            r = 0
            for lane in range(2):
                x = _bf16_bits_to_float((a[0] >> (16 * lane)) & 0xFFFF)
                y = _bf16_bits_to_float((a[1] >> (16 * lane)) & 0xFFFF)
                r |= _float_to_bf16_bits(x * y) << (16 * lane)
        else:
            raise AssertionError(f"instruction {op!r} is not emulated")
        regs[d] = r & 0xFFFFFFFF
    return regs["$0"], regs["$1"]


def test_e4m3_to_bf16_ptx_is_exact_for_every_byte_in_every_position():
    asm = K._E4M3_BF16_ASM.value if hasattr(K._E4M3_BF16_ASM, "value") else K._E4M3_BF16_ASM
    assert re.search(r"mul\.rn\.bf16x2", asm)
    want = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.bfloat16)
    want_bits = want.view(torch.int16).int() & 0xFFFF
    nan = torch.isnan(want)
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    for pos in range(4):
        for b in range(256):
            others = torch.randint(0, 256, (4,), generator=gen).tolist()
            others[pos] = b
            word = sum(v << (8 * i) for i, v in enumerate(others))
            lo, hi = _run_ptx(asm, word)
            lanes = [lo & 0xFFFF, lo >> 16, hi & 0xFFFF, hi >> 16]
            for i, v in enumerate(others):
                if nan[v]:  # e4m3fn has no infinities; its NaN bytes (0x7F, 0xFF) never occur in quantised weights
                    continue
                assert lanes[i] == want_bits[v], (pos, i, hex(v), hex(lanes[i]), hex(int(want_bits[v])))


@pytest.mark.gpu
def test_e4m3_to_bf16_on_the_gpu_matches_torch():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    import triton
    import triton.language as tl

    @triton.jit
    def conv(src, dst, N: tl.constexpr):
        offs = tl.arange(0, N)
        tl.store(dst + offs, K._wcast(tl.load(src + offs), tl.bfloat16))

    raw = torch.randint(0, 256, (4096,), dtype=torch.uint8, device="cuda")
    raw[:256] = torch.arange(256, dtype=torch.uint8, device="cuda")
    w = raw.view(torch.float8_e4m3fn)
    out = torch.empty(4096, dtype=torch.bfloat16, device="cuda")
    conv[(1,)](w, out, 4096)
    want = w.to(torch.bfloat16)
    ok = ~torch.isnan(want)
    assert torch.equal(out[ok].view(torch.int16), want[ok].view(torch.int16))
