"""``eagle-triton generate``: checks before loading, streaming, Ctrl-C with the partial output, one-line errors.

The model loaders are replaced by a tiny random Llama with a byte-level tokenizer (tests/cli_testlib.py)."""

import json

import pytest
from cli_testlib import byte_tokenizer, tiny_engine, tiny_head, tiny_target

from eagle_triton.cli import main
from eagle_triton.commands._stream import TextStream

PROMPT = "Dis-moi où est l'été ☀ 😀"


def _fail_if_called(*args, **kwargs):
    raise AssertionError("a model was loaded although the arguments were bad")


@pytest.fixture
def no_loading(monkeypatch):
    import eagle_triton.engine.loading as loading

    for name in ("load_target", "load_tokenizer", "load_head"):
        monkeypatch.setattr(loading, name, _fail_if_called)


@pytest.fixture
def tiny_models(monkeypatch, tmp_path):
    """Loaders that give the tiny model; returns the argv naming a target folder and a draft folder."""
    import eagle_triton.engine.loading as loading

    state = {"targets": []}

    def load_target(source, device=None, dtype=None, impl="auto", **kw):
        t = tiny_target()
        state["targets"].append(t)
        return t

    monkeypatch.setattr(loading, "load_tokenizer", lambda source, gguf_file=None: byte_tokenizer())
    monkeypatch.setattr(loading, "load_target", load_target)
    monkeypatch.setattr(loading, "load_head", lambda source, target, kind=None: tiny_head())
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text("{}")
    (tmp_path / "head").mkdir()
    (tmp_path / "head" / "config.json").write_text("{}")
    state["argv"] = ["--target", str(tmp_path / "target"), "--device", "cpu", "--no-chat-template",
                     "--total-tokens", "8", "--depth", "2", "--draft-top-k", "3", "--threads", "1"]
    state["draft"] = ["--draft", str(tmp_path / "head")]
    return state


def _error_line(capsys, cmd="generate") -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"eagle-triton {cmd}: error: "), err
    return err[0]


@pytest.mark.parametrize("argv, words", [
    (["--draft", "/nonexistent/head"], "does not exist"),
    (["--prompt", ""], "prompt is empty"),
    (["--prompt", "   "], "prompt is empty"),
    (["--prompt", "caf\udcff"], "not valid UTF-8"),  # what Python makes of argv bytes that are not UTF-8
    (["--temperature", "-0.5"], "--temperature"),
    (["--top-p", "0"], "--top-p"),
    (["--top-p", "1.5"], "--top-p"),
    (["--top-k", "-1"], "--top-k"),
    (["--max-new-tokens", "-3"], "--max-new-tokens"),
    (["--total-tokens", "1"], "draft tree"),
    (["--total-tokens", "500", "--depth", "1", "--draft-top-k", "2"], "draft tree"),
    (["--threads", "0"], "--threads"),
    (["--max-length", "1"], "--max-length"),
    (["--target", "/nonexistent/model.gguf"], "does not exist"),
    (["--device", "cuda:0"], "CUDA is not available"),
    (["--dtype", "float8"], "unknown dtype"),
])
def test_bad_input_fails_fast_in_one_line(argv, words, capsys, no_loading, tmp_path):
    import torch

    if "cuda:0" in argv and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    if "--draft" in argv:  # a head folder without config.json is refused too
        (tmp_path / "h").mkdir()
        assert main(["generate", "--draft", str(tmp_path / "h")]) == 2
        assert "not a draft head folder" in _error_line(capsys)
    assert main(["generate"] + argv) == 2
    assert words in _error_line(capsys)


def test_max_new_tokens_zero_prints_nothing_without_loading(capsys, no_loading):
    assert main(["generate", "--max-new-tokens", "0"]) == 0
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_no_misleading_draft_note_before_a_target_error(capsys, no_loading):
    assert main(["generate", "--target", "./missing-model"]) == 2
    assert "no --draft" not in capsys.readouterr().err


def test_prompt_too_long_is_checked_before_the_weights(capsys, tiny_models, monkeypatch):
    import eagle_triton.engine.loading as loading

    monkeypatch.setattr(loading, "load_target", _fail_if_called)
    assert main(["generate", "--prompt", "x" * 40, "--max-length", "16"] + tiny_models["argv"]) == 2
    assert "the prompt has 40 tokens but --max-length is 16" in _error_line(capsys)


@pytest.mark.parametrize("speculative", [False, True])
def test_streams_the_text_and_summary_goes_to_stderr(capsys, tiny_models, speculative):
    argv = ["generate", "--prompt", PROMPT, "--max-new-tokens", "24"] + tiny_models["argv"]
    argv += tiny_models["draft"] if speculative else ["--no-speculation"]
    assert main(argv + ["--json"]) == 0
    result = json.loads(capsys.readouterr().out)  # --json: stdout is exactly one JSON object
    assert result["interrupted"] is False and len(result["token_ids"]) == 24
    assert result["speculative"] is speculative
    assert main(argv) == 0
    out = capsys.readouterr()
    assert out.out == result["text"] + "\n"
    assert "tokens/s" in out.err


def test_text_stream_matches_decode_with_split_characters():
    tok = byte_tokenizer()
    ids = tok(PROMPT)["input_ids"]
    assert len(ids) > len(PROMPT)  # multi-byte characters span several tokens
    for step in (1, 2, 3, 5):
        stream = TextStream(tok)
        pieces = [stream.push(ids[i:i + step]) for i in range(0, len(ids), step)] + [stream.flush()]
        assert "".join(pieces) == PROMPT
        assert all("\ufffd" not in p for p in pieces)  # never half a character
    import random

    rng = random.Random(0)
    for _ in range(20):  # random bytes, many of them invalid UTF-8: the same text as one decode
        ids = [rng.randrange(256) for _ in range(40)]
        stream = TextStream(tok)
        text = ""
        k = 0
        while k < len(ids):
            n = rng.randint(1, 4)
            text += stream.push(ids[k:k + n])
            k += n
        assert text + stream.flush() == tok.decode(ids)


class _InterruptAfter:
    """Wraps a target's ``decode_rows`` so that its ``n``-th call raises KeyboardInterrupt (Ctrl-C mid-generation)."""

    def __init__(self, target, n):  # the plain decode step of the device-paced engine
        self.decode, self.n, self.calls = target.decode_rows, n, 0
        target.decode_rows = self

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.n:
            raise KeyboardInterrupt
        return self.decode(*args, **kwargs)


@pytest.mark.parametrize("as_json", [False, True])
def test_ctrl_c_mid_generation_returns_the_partial_output(capsys, tiny_models, monkeypatch, as_json):
    import eagle_triton.engine.loading as loading

    argv = ["generate", "--prompt", PROMPT, "--max-new-tokens", "20", "--no-speculation", "--json"]
    argv += tiny_models["argv"]
    assert main(argv) == 0
    full = json.loads(capsys.readouterr().out)
    real = loading.load_target

    def interrupted_target(*args, **kwargs):
        t = real(*args, **kwargs)
        # the 7th step raises while it is queued, before the 6th is read: the root token and 5 steps are out
        _InterruptAfter(t, 7)
        return t

    monkeypatch.setattr(loading, "load_target", interrupted_target)
    rc = main([a for a in argv if as_json or a != "--json"])
    out = capsys.readouterr()
    assert rc == 130
    err = out.err.strip().splitlines()
    assert err[-1] == "eagle-triton generate: interrupted (Ctrl-C) after 6 new tokens" and "Traceback" not in out.err
    if as_json:
        partial = json.loads(out.out)
        assert partial["interrupted"] is True and partial["token_ids"] == full["token_ids"][:6]
        assert partial["text"] == byte_tokenizer().decode(full["token_ids"][:6])
    else:
        assert out.out == byte_tokenizer().decode(full["token_ids"][:6]) + "\n"


def test_ctrl_c_while_loading_is_one_line(capsys, tiny_models, monkeypatch):
    import eagle_triton.engine.loading as loading

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(loading, "load_target", interrupted)
    assert main(["generate"] + tiny_models["argv"] + tiny_models["draft"]) == 130
    out = capsys.readouterr()
    assert out.out == "" and out.err.strip().splitlines() == ["eagle-triton generate: interrupted (Ctrl-C)"]


def test_capped_by_max_length_says_so_on_stderr(capsys, tiny_models):
    argv = ["generate", "--prompt", "abcdefghij", "--max-new-tokens", "30", "--max-length", "16",
            "--no-speculation"] + tiny_models["argv"]
    assert main(argv) == 0
    assert "at --max-length 16" in capsys.readouterr().err
    assert main(argv + ["--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["stats"]["stop_reason"] == "max_length" and "at --max-length 16" in out.err


def test_target_smollm2_names_the_default_model(monkeypatch, tmp_path):
    import eagle_triton.engine.default_model as default_model
    from eagle_triton.commands.generate import resolve_target

    gguf = tmp_path / "SmolLM2.gguf"
    monkeypatch.setattr(default_model, "smollm2_gguf_path", lambda: gguf)
    assert resolve_target("smollm2") == resolve_target(None) == str(gguf)
    assert resolve_target("some/dir") == "some/dir"


def test_generate_accepts_target_smollm2(capsys, tiny_models, monkeypatch, tmp_path):
    import eagle_triton.engine.default_model as default_model

    seen = []
    monkeypatch.setattr(default_model, "smollm2_gguf_path", lambda: tmp_path / "SmolLM2.gguf")
    # the CLI loads the default model from its cached converted copy (here: the stubbed source itself)
    monkeypatch.setattr(default_model, "default_target_source", lambda: tmp_path / "SmolLM2.gguf")
    import eagle_triton.engine.loading as loading

    real = loading.load_target
    monkeypatch.setattr(loading, "load_target", lambda source, **kw: seen.append(source) or real(source, **kw))
    assert main(["generate", "--target", "smollm2", "--no-speculation", "--max-new-tokens", "3", "--device", "cpu",
                 "--json"]) == 0
    assert seen == [str(tmp_path / "SmolLM2.gguf")]


def test_unexpected_errors_are_one_line_and_debug_shows_the_traceback(capsys, tiny_models, monkeypatch):
    import eagle_triton.engine.loading as loading

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access\nmore detail")

    monkeypatch.setattr(loading, "load_target", broken)
    assert main(["generate"] + tiny_models["argv"] + tiny_models["draft"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["eagle-triton generate: error: RuntimeError: CUDA error: an illegal memory access; more detail "
                   "(run with --debug for the traceback)"]
    with pytest.raises(RuntimeError, match="illegal memory access"):
        main(["--debug", "generate"] + tiny_models["argv"])
    with pytest.raises(RuntimeError, match="illegal memory access"):
        main(["generate", "--debug"] + tiny_models["argv"])


@pytest.mark.parametrize("speculative", [False, True])
def test_engine_on_tokens_hands_out_each_step(speculative):
    engine = tiny_engine(head=speculative)
    ids = byte_tokenizer()(PROMPT)["input_ids"]
    for max_new, eos in ((17, None), (40, "first-repeat")):
        got = []
        ref, _ = engine.generate(input_ids=ids, max_new_tokens=max_new, eos_token_id=None)
        eos_id = None
        if eos:  # a token that occurs mid-way: generation stops right after it, the callback sees the same cut
            eos_id = ref[5]
        tokens, stats = engine.generate(input_ids=ids, max_new_tokens=max_new, eos_token_id=eos_id,
                                        on_tokens=got.append)
        assert sum(got, []) == tokens and all(got)
        assert len(got) == stats.steps + 1  # the prefill's root, then one call per step
        if eos:
            assert tokens == ref[:ref.index(eos_id) + 1]
        else:
            assert tokens == ref


def test_target_norm_reaches_the_target(capsys, tiny_models, monkeypatch):
    """--target-norm kernel asks the target loader for the RMSNorm as its own kernel; without it the loader gets
    no norm_mode (the fast target's default, folded); a mode that does not exist is a usage error."""
    import eagle_triton.engine.loading as loading

    stub, seen = loading.load_target, []

    def spy(source, **kw):
        seen.append(kw.get("norm_mode"))
        return stub(source, **kw)

    monkeypatch.setattr(loading, "load_target", spy)
    argv = ["generate", "--prompt", PROMPT, "--max-new-tokens", "2", "--no-speculation"] + tiny_models["argv"]
    assert main(argv + ["--target-norm", "kernel"]) == 0
    assert main(argv) == 0
    assert seen == ["kernel", None]
    with pytest.raises(SystemExit) as e:
        main(argv + ["--target-norm", "fused"])
    assert e.value.code == 2 and "invalid choice: 'fused'" in capsys.readouterr().err
