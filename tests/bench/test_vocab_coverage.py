"""bench/vocab_coverage.py on the CPU: the share of the target's greedy answers and of a data pack's response tokens
inside a head's draft vocabulary, and inside vocabularies chosen or grown from the pack's counts."""

import json

import pytest
import torch
import vocab_coverage
from chat_testlib import save_tiny_chat_target, tiny_chat_model, tiny_tokenizer

from eagle_triton.train import DataConfig, export_dataset, generate_dataset, load_dataset, token_counts

pytest.importorskip("tokenizers")


def test_coverage_of_answers_and_data(tmp_path):
    target = save_tiny_chat_target(tmp_path / "target")
    tok = tiny_tokenizer()
    model = tiny_chat_model(tok)
    cfg = DataConfig(num_prompts=8, batch_size=8, prompt_max_tokens=8, max_new_tokens=16,
                     response_temperatures=[1.0], seed=5)
    generate_dataset(model, tok, cfg, tmp_path / "data", progress=False, log=lambda *_: None)
    export_dataset(tmp_path / "data", tmp_path / "pack.pt.gz")
    V = model.config.vocab_size
    head_ids = torch.randperm(V, generator=torch.Generator().manual_seed(int(torch.randint(1 << 30, ())))
                              )[:V // 3].sort().values
    head = tmp_path / "head"
    head.mkdir()
    (head / "train_meta.json").write_text(json.dumps({"vocab_used": head_ids.tolist()}))
    (head / "config.json").write_text(json.dumps({"vocab_size": V}))
    argv = ["--head", str(head), "--target", target, "--data", str(tmp_path / "pack.pt.gz"), "--sizes",
            f"{V // 3},{V // 2}", "--datasets", "mtbench", "--limit", "3", "--max-new-tokens", "6", "--batch", "2",
            "--out", str(tmp_path / "o")]
    assert vocab_coverage.main(argv) == 0
    doc = json.loads((tmp_path / "o" / "vocab_coverage.json").read_text())
    assert doc["benchmark"] == "vocab_coverage" and doc["data"] == [str(tmp_path / "pack.pt.gz")]
    cov = doc["coverage"]

    # the data's share, recomputed from the pack
    samples = load_dataset(tmp_path / "pack.pt.gz")
    counts = token_counts([s.ids for s in samples], V, starts=[s.resp_start for s in samples])
    data = cov["data responses"]
    assert data["tokens"] == int(counts.sum())
    assert data["covered"][f"head ({V // 3})"] == round(float(counts[head_ids].sum()) / float(counts.sum()), 5)
    assert data["covered"][f"head grown ({V // 2})"] >= data["covered"][f"head ({V // 3})"]
    assert data["covered"][f"from data ({V // 2})"] >= data["covered"][f"from data ({V // 3})"]

    # the answers' share, recomputed from the same greedy answers
    answers, _ = vocab_coverage.greedy_answers(target, vocab_coverage.load_prompts("mtbench")[:3], 6, 2)
    toks = torch.tensor([t for a in answers for t in a])
    assert cov["mtbench"]["tokens"] == toks.numel() > 0
    inside = torch.isin(toks, head_ids).float().mean().item()
    assert cov["mtbench"]["covered"][f"head ({V // 3})"] == round(inside, 5)


def test_a_result_file_it_did_not_write_is_left_alone(tmp_path):
    (tmp_path / "vocab_coverage.json").write_text("{\"mine\": 1}")
    with pytest.raises(SystemExit, match="not written by vocab_coverage"):
        vocab_coverage.main(["--datasets", "", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "vocab_coverage.json").read_text()) == {"mine": 1}
