"""The offline project tokenizer: round-trips, caches by content, renders the chat template."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout.tokenizer import MARKUP_TOKENS, SPECIAL_TOKENS, build_tokenizer

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tok")


def test_small_vocab_with_whole_markup_tokens(cache: Path) -> None:
    tok = build_tokenizer(cache_dir=cache)
    assert 2000 <= len(tok) <= 8192
    for t in SPECIAL_TOKENS + MARKUP_TOKENS:
        assert tok.convert_ids_to_tokens(tok.encode(t, add_special_tokens=False)) == [t]


def test_cached_by_content_hash(cache: Path) -> None:
    from rollout import tokenizer as module

    a = build_tokenizer(cache_dir=cache)
    module._LOADED.clear()  # force the on-disk path
    entries = sorted(p.name for p in cache.iterdir() if not p.name.startswith("."))
    b = build_tokenizer(cache_dir=cache)
    assert entries == sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) and len(entries) == 1
    text = "def f(x):\n    return x  # <tool_call>"
    assert a.encode(text) == b.encode(text)


@settings(max_examples=200, deadline=None)
@given(text=st.text())
def test_decode_encode_roundtrip(cache: Path, text: str) -> None:
    tok = build_tokenizer(cache_dir=cache)
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_chat_template_renders_tools_thinking_and_tool_results(cache: Path) -> None:
    tok = build_tokenizer(cache_dir=cache)
    msgs = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": "A", "reasoning_content": "R",
         "tool_calls": [{"id": "1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "1", "content": "T"},
    ]
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    text = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nS\n\n# Tools\n") and '{"name": "bash"' in text
    assert '<think>R</think>\nA<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>' in text
    assert text.endswith("<|im_start|>tool\nT<|im_end|>\n<|im_start|>assistant\n")
