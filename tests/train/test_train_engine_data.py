"""Self-distillation data written by the eagle-triton engine (``DataConfig(generator="engine")``) on the CPU: each
answer is what the engine gives that conversation alone, the data resume bit for bit, rows past the engine's
capacity are dropped, and a generator of the wrong kind is refused."""

import json
import types

import pytest
import torch
from chat_testlib import save_tiny_chat_target, tiny_chat_model, tiny_tokenizer

from eagle_triton.engine import EagleEngine
from eagle_triton.train import DataConfig, export_dataset, generate_dataset, load_dataset, sample_user_prompts
from eagle_triton.train.data import _stop_ids
from eagle_triton.train.generation import EngineGenerator, engine_seed

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def tiny():
    tok = tiny_tokenizer()
    return tiny_chat_model(tok, heads=3, kv_heads=1), tok  # head_dim 16: the fused drafter runs it


def _engine(model, tok, max_length=256):
    """A plain (headless) engine: batched speculation equals plain decoding by the engine's own tests, and the
    interpreter's drafter would make this slow."""
    return EagleEngine.from_pretrained(model, None, device="cpu", dtype=torch.float32, max_length=max_length,
                                       tokenizer=tok)


def _quiet(**kw):
    return dict(progress=False, log=lambda *_: None, **kw)


def test_engine_data_is_what_the_engine_gives_each_conversation_alone(tmp_path, tiny):
    model, tok = tiny
    eng = _engine(model, tok)
    cfg = DataConfig(num_prompts=5, batch_size=3, prompt_max_tokens=8, max_new_tokens=12,
                     response_temperatures=[0.0, 0.9], seed=2, turns=2, generator="engine")
    st = generate_dataset(eng, tok, cfg, tmp_path / "d", **_quiet())
    assert st["complete"] and st["batches_done"] == 2
    shards = [torch.load(f, weights_only=True) for f in sorted((tmp_path / "d").glob("shard_*.pt"))]
    assert [s["temperature"] for s in shards] == [0.0, 0.9]
    stop = sorted(_stop_ids(tok))
    greedy = shards[0]
    assert 0 in greedy["turn"]
    for ids, start in zip(greedy["ids"], greedy["resp_start"], strict=True):
        alone, _ = eng.generate(input_ids=ids[:start].tolist(), max_new_tokens=cfg.max_new_tokens, speculative=False,
                                eos_token_id=stop)
        assert ids[start:].tolist() == alone  # greedy: the same tokens as a lone plain generation
    # Deleting a shard regenerates it bit for bit (sampled turns included: one seed per sequence).
    before = [s.ids.tolist() for s in load_dataset(tmp_path / "d")]
    (tmp_path / "d" / "shard_00001.pt").unlink()
    generate_dataset(eng, tok, cfg, tmp_path / "d", **_quiet())
    assert [s.ids.tolist() for s in load_dataset(tmp_path / "d")] == before


def test_engine_data_do_not_depend_on_the_slots(tmp_path, tiny):
    """The same conversations, sampled turns included, whether 2 or 32 of them run at once (a plain writer takes
    up to 64 slots: buckets 32 and 64)."""
    model, tok = tiny
    eng = _engine(model, tok)
    data = []
    for slots in (2, 32):
        cfg = DataConfig(num_prompts=20, batch_size=20, prompt_max_tokens=6, max_new_tokens=8,
                         response_temperatures=[0.9], seed=3, generator="engine", engine_slots=slots)
        assert generate_dataset(eng, tok, cfg, tmp_path / str(slots), **_quiet())["complete"]
        data.append([s.ids.tolist() for s in load_dataset(tmp_path / str(slots))])
    assert data[0] == data[1] and len(data[0]) == 20


def test_sampled_prompts_follow_their_row_seeds(tiny):
    model, tok = tiny
    eng = _engine(model, tok)
    a = sample_user_prompts(eng, tok, 4, max_tokens=6, seed=5)
    assert sample_user_prompts(eng, tok, 4, max_tokens=6, seed=5) == a
    gen = EngineGenerator(eng, _stop_ids(tok), slots=2)
    rows = gen([[1, 40], [1, 41, 42]], 5, 1.0, 0.95, 7)
    alone, _ = eng.generate(input_ids=[1, 41, 42], max_new_tokens=5, temperature=1.0, top_p=0.95,
                            seed=engine_seed(7, 1), speculative=False, eos_token_id=sorted(_stop_ids(tok)))
    assert rows[1] == alone


def test_rows_past_the_engine_capacity_are_dropped_not_fatal(tiny):
    model, tok = tiny
    eng = _engine(model, tok, max_length=20)
    gen = EngineGenerator(eng, _stop_ids(tok))
    out = gen([[1] * 25, [1, 40, 41]], 4, 0.0, 1.0, 0)
    assert out[0] == [] and 1 <= len(out[1]) <= 4 and gen.too_long == 1


def test_generator_kind_must_match_the_settings(tmp_path, tiny):
    model, tok = tiny
    eng = _engine(model, tok)
    with pytest.raises(ValueError, match="needs an EagleEngine"):
        generate_dataset(model, tok, DataConfig(num_prompts=2, batch_size=2, generator="engine"), tmp_path / "a",
                         **_quiet())
    with pytest.raises(ValueError, match="generator='engine'"):
        generate_dataset(eng, tok, DataConfig(num_prompts=2, batch_size=2), tmp_path / "b", **_quiet())
    with pytest.raises(ValueError, match="generator must be"):
        DataConfig(generator="vllm")
    with pytest.raises(ValueError, match="slots must be in 1..64"):
        EngineGenerator(eng, [2], slots=65)
    assert EngineGenerator(eng, [2], slots=64).slots == 64  # a headless engine: plain batches up to 64
    with pytest.raises(ValueError, match="slots 17: an engine with a draft head writes at most 16"):
        EngineGenerator(types.SimpleNamespace(speculative=True), [2], slots=17)
    with pytest.raises(ValueError, match="engine_slots must be in 1..64"):
        DataConfig(engine_slots=0)
    with pytest.raises(ValueError, match="engine_seed"):
        engine_seed(-1, 0)


def test_cli_writes_engine_data_and_refuses_a_head_without_the_engine(tmp_path, capsys):
    from eagle_triton.cli import main

    save_tiny_chat_target(tmp_path / "target", heads=3, kv_heads=1)
    base = ["train", "--target", str(tmp_path / "target"), "--stage", "data", "--num-prompts", "3",
            "--gen-batch-size", "3", "--prompt-max-tokens", "5", "--max-new-tokens", "6", "--no-progress",
            "--device", "cpu"]
    assert main(base + ["--work-dir", str(tmp_path / "w0"), "--gen-draft", "none"]) == 2
    assert "--gen-draft needs --data-generator engine" in capsys.readouterr().err
    assert not (tmp_path / "w0").exists()
    assert main(base + ["--work-dir", str(tmp_path / "w"), "--data-generator", "engine", "--gen-draft", "none"]) == 0
    manifest = json.loads((tmp_path / "w" / "data" / "manifest.json").read_text())
    assert manifest["config"]["generator"] == "engine"
    assert 1 <= len(load_dataset(tmp_path / "w" / "data")) <= 3
    assert main(base + ["--work-dir", str(tmp_path / "w1"), "--data-generator", "engine", "--gen-slots", "65"]) == 2
    assert "--gen-slots must be in 1..64" in capsys.readouterr().err
    # the embedded SmolLM2's writer drafts with the shipped head by default: at most 16 at once
    assert main(["train", "--stage", "data", "--data-generator", "engine", "--gen-slots", "32", "--work-dir",
                 str(tmp_path / "w2"), "--no-progress", "--device", "cpu"]) == 2
    assert "pass --gen-draft none for more" in capsys.readouterr().err
    assert not (tmp_path / "w1").exists() and not (tmp_path / "w2").exists()


def test_cli_extra_data_joins_the_training_set(tmp_path, monkeypatch):
    """--extra-data folders' conversations follow work-dir/data's in the training set; an empty one is refused."""
    import eagle_triton.train as train_pkg
    from eagle_triton.cli import main

    save_tiny_chat_target(tmp_path / "target", heads=3, kv_heads=1)
    base = ["train", "--target", str(tmp_path / "target"), "--num-prompts", "2", "--gen-batch-size", "2",
            "--prompt-max-tokens", "4", "--max-new-tokens", "5", "--no-progress", "--device", "cpu"]
    for w, seed in (("a", "1"), ("b", "2")):
        assert main(base + ["--work-dir", str(tmp_path / w), "--stage", "data", "--seed", seed]) == 0
    seen = {}

    def fake_train(target, tok, samples, cfg, out_dir, **kw):
        seen["ids"] = [s.ids.tolist() for s in samples]
        raise SystemExit(0)

    monkeypatch.setattr(train_pkg, "train_eagle3", fake_train)
    with pytest.raises(SystemExit):
        main(base + ["--work-dir", str(tmp_path / "a"), "--stage", "train", "--extra-data",
                     str(tmp_path / "b" / "data")])
    both = load_dataset(tmp_path / "a" / "data") + load_dataset(tmp_path / "b" / "data")
    assert seen["ids"] == [s.ids.tolist() for s in both]
    # a pack of b's data, read in place, joins the same way (nothing is unpacked into a's work folder)
    export_dataset(tmp_path / "b" / "data", tmp_path / "b.pt.gz")
    before = sorted(p.name for p in (tmp_path / "a" / "data").iterdir())
    seen.clear()
    with pytest.raises(SystemExit):
        main(base + ["--work-dir", str(tmp_path / "a"), "--stage", "train", "--extra-data", str(tmp_path / "b.pt.gz")])
    assert seen["ids"] == [s.ids.tolist() for s in both]
    assert sorted(p.name for p in (tmp_path / "a" / "data").iterdir()) == before
    (tmp_path / "empty").mkdir()
    assert main(base + ["--work-dir", str(tmp_path / "a"), "--stage", "train", "--extra-data",
                        str(tmp_path / "empty")]) == 2


def test_cli_prompt_openers(tmp_path):
    """--prompt-openers builtin / FILE reach the data settings (recorded in the manifest); a missing or empty file
    is refused before anything runs."""
    from eagle_triton.cli import main
    from eagle_triton.train import INSTRUCTION_OPENERS

    save_tiny_chat_target(tmp_path / "target", heads=3, kv_heads=1)
    base = ["train", "--target", str(tmp_path / "target"), "--num-prompts", "2", "--gen-batch-size", "2",
            "--prompt-max-tokens", "4", "--max-new-tokens", "4", "--no-progress", "--device", "cpu", "--stage", "data"]
    (tmp_path / "openers.txt").write_text("Write\n\n  Solve  \n")
    for work, value, expected in (("a", "builtin", INSTRUCTION_OPENERS), ("b", str(tmp_path / "openers.txt"),
                                                                          ["Write", "Solve"])):
        assert main(base + ["--work-dir", str(tmp_path / work), "--prompt-openers", value]) == 0
        manifest = json.loads((tmp_path / work / "data" / "manifest.json").read_text())
        assert manifest["config"]["prompt_openers"] == list(expected)
    (tmp_path / "empty.txt").write_text("\n \n")
    assert main(base + ["--work-dir", str(tmp_path / "c"), "--prompt-openers", str(tmp_path / "missing.txt")]) == 2
    assert main(base + ["--work-dir", str(tmp_path / "c"), "--prompt-openers", str(tmp_path / "empty.txt")]) == 2
    assert not (tmp_path / "c").exists()
