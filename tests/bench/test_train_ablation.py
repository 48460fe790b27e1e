"""bench/train_ablation.py on the CPU: variants that differ in one setting, each from the same start, validated on
the same held-out positions with one validation setting; bad variants are refused before anything loads."""

import json

import pytest
import train_ablation
from chat_testlib import save_tiny_chat_target, tiny_chat_model, tiny_tokenizer

from eagle_triton.train import DataConfig, export_dataset, generate_dataset

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def target_and_pack(tmp_path_factory):
    root = tmp_path_factory.mktemp("ablation")
    target = save_tiny_chat_target(root / "target")
    tok = tiny_tokenizer()
    model = tiny_chat_model(tok)
    cfg = DataConfig(num_prompts=40, batch_size=20, prompt_max_tokens=8, max_new_tokens=16,
                     response_temperatures=[0.0, 1.0], seed=4)
    generate_dataset(model, tok, cfg, root / "data", progress=False, log=lambda *_: None)
    export_dataset(root / "data", root / "pack.pt.gz")
    return target, str(root / "pack.pt.gz")


def test_variants_from_one_start_on_one_validation_set(tmp_path, target_and_pack, monkeypatch):
    target, pack = target_and_pack
    monkeypatch.setitem(train_ablation.BASE, "draft_vocab_size", 48)  # the tiny target has 112 ids
    monkeypatch.setitem(train_ablation.BASE, "max_len", 64)
    monkeypatch.setitem(train_ablation.BASE, "tokens_per_batch", 256)
    argv = ["--target", target, "--data", pack, "--steps", "3", "--variants", "base;lr=2e-3;ttt_steps=2",
            "--val-fraction", "0.1", "--val-ttt-steps", "3", "--val-max-len", "64", "--device", "cpu",
            "--out", str(tmp_path), "--tag", "t"]
    assert train_ablation.main(argv) == 0
    res = json.loads((tmp_path / "train_ablation_t.json").read_text())
    assert (tmp_path / "train_ablation_t.png").is_file()
    names = [v["name"] for v in res["variants"]]
    assert names == ["base", "lr=2e-3", "ttt_steps=2"] and res["complete"] is True
    assert res["variants"][1]["overrides"] == {"lr": 2e-3} and res["variants"][2]["settings"]["ttt_steps"] == 2
    # one validation for all: the same positions, as many unrolled steps, whatever the variant trained with
    assert len({v["val_positions"] for v in res["variants"]}) == 1 and res["variants"][0]["val_positions"] > 0
    assert all(len(v["val_acc"]) == 3 and v["steps"] == 3 for v in res["variants"])
    assert res["variants"][0]["val_acc"] != res["variants"][1]["val_acc"]  # another learning rate, another head
    # a second run replaces its own file; a foreign file of that name is left alone
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "train_ablation.json").write_text("{}")
    with pytest.raises(SystemExit, match="not written by train_ablation"):
        train_ablation.main(argv[:-4] + ["--out", str(tmp_path / "x")])
    assert (tmp_path / "x" / "train_ablation.json").read_text() == "{}"


def test_a_run_cut_short_keeps_the_variants_it_finished(tmp_path, target_and_pack, monkeypatch):
    """The JSON is rewritten after every variant: a run stopped during its second variant (a call's time limit)
    leaves the first one's result, marked incomplete."""
    target, pack = target_and_pack
    monkeypatch.setitem(train_ablation.BASE, "draft_vocab_size", 48)
    monkeypatch.setitem(train_ablation.BASE, "max_len", 64)
    monkeypatch.setitem(train_ablation.BASE, "tokens_per_batch", 256)
    real = train_ablation.run_variant

    def stopped_in_the_second(name, *a, **k):
        if name != "base":
            raise KeyboardInterrupt("time limit")
        return real(name, *a, **k)

    monkeypatch.setattr(train_ablation, "run_variant", stopped_in_the_second)
    argv = ["--target", target, "--data", pack, "--steps", "2", "--variants", "base;lr=2e-3", "--val-fraction", "0.1",
            "--val-ttt-steps", "2", "--val-max-len", "64", "--device", "cpu", "--out", str(tmp_path)]
    with pytest.raises(KeyboardInterrupt):
        train_ablation.main(argv)
    res = json.loads((tmp_path / "train_ablation.json").read_text())
    assert [v["name"] for v in res["variants"]] == ["base"] and res["complete"] is False
    assert len(res["variants"][0]["val_acc"]) == 2
    assert [f.name for f in tmp_path.iterdir()] == ["train_ablation.json"]  # no temporary file left behind


def test_bad_variants_are_refused():
    with pytest.raises(SystemExit, match="key=value"):
        train_ablation.parse_variants("lr", init_head=False)
    with pytest.raises(SystemExit, match="key=value"):
        train_ablation.parse_variants("momentum=0.9", init_head=False)
    with pytest.raises(SystemExit, match="not a number"):
        train_ablation.parse_variants("lr=fast", init_head=False)
    with pytest.raises(SystemExit, match="from scratch"):
        train_ablation.parse_variants("base;draft_vocab_size=8192", init_head=True)
    with pytest.raises(SystemExit, match="pass --init-head"):
        train_ablation.parse_variants("grow_draft_vocab=16384", init_head=False)
    with pytest.raises(SystemExit, match="twice"):
        train_ablation.parse_variants("base;base", init_head=False)
    with pytest.raises(SystemExit, match="no such file or folder"):
        train_ablation.load_samples("/nonexistent/pack.pt.gz")
    assert train_ablation.parse_variants("base; max_len=1024,lr=5e-4", init_head=False) == [
        ("base", {}), ("max_len=1024,lr=5e-4", {"max_len": 1024, "lr": 5e-4})]


def test_variants_continue_from_a_head(tmp_path, target_and_pack, monkeypatch):
    from eagle_triton.train import TrainConfig, import_dataset, load_dataset, load_target, train_eagle3

    target, pack = target_and_pack
    model, tok = load_target(target)
    import_dataset(pack, tmp_path / "d")
    train_eagle3(model, tok, load_dataset(tmp_path / "d"),
                 TrainConfig(draft_vocab_size=48, max_len=64, tokens_per_batch=256, max_steps=2, save_every=0,
                             intermediate_size=64, save_dtype="float32"),
                 tmp_path / "start", progress=False, log=lambda *_: None)
    monkeypatch.setitem(train_ablation.BASE, "max_len", 64)
    monkeypatch.setitem(train_ablation.BASE, "tokens_per_batch", 256)
    argv = ["--target", target, "--data", str(tmp_path / "d"), "--init-head", str(tmp_path / "start" / "head"),
            "--steps", "2", "--variants", "base;max_len=32;grow_draft_vocab=64", "--val-fraction", "0.1",
            "--val-ttt-steps", "2", "--val-max-len", "64", "--device", "cpu", "--out", str(tmp_path / "o")]
    assert train_ablation.main(argv) == 0
    res = json.loads((tmp_path / "o" / "train_ablation.json").read_text())
    assert res["start_step"] == 2 and [v["steps"] for v in res["variants"]] == [2, 2, 2]
    assert res["variants"][2]["settings"]["grow_draft_vocab"] == 64
    assert len({v["val_positions"] for v in res["variants"]}) == 1


def test_data_from_several_packs_in_order(target_and_pack, tmp_path):
    from eagle_triton.train import import_dataset, load_dataset

    _, pack = target_and_pack
    import_dataset(pack, tmp_path / "d")
    one = [s.ids.tolist() for s in load_dataset(pack)]
    both = [s.ids.tolist() for s in train_ablation.load_samples(f"{pack},{tmp_path / 'd'}")]
    assert both == one + one and len(one) > 0
