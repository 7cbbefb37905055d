"""A checkpoint's tokenizer comes back exactly: the same ids for every text and the same chat template.

Found by training experts from a saved warm start (teachers train): AutoTokenizer turned the project
tokenizer into a Qwen2Tokenizer with its own pre-tokenizer (digits split one by one), so the reloaded
model saw prompts tokenized unlike anything it was trained on and passed nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout.harnesses import get_harness
from rollout.policy.models import load_checkpoint, save_checkpoint, tiny_model
from rollout.tokenizer import build_tokenizer

pytestmark = pytest.mark.unit


def test_a_saved_checkpoint_tokenizes_like_the_tokenizer_it_was_saved_with(tmp_path: Path) -> None:
    tok = build_tokenizer()
    model, _ = tiny_model(seed=0, tokenizer=tok)
    save_checkpoint(model, tok, tmp_path / "ckpt")
    _, again = load_checkpoint(tmp_path / "ckpt")
    prompt = get_harness("claude_code").render("Count the 10 lines of /workspace/data.txt.", "high")
    for text in ("timeout in milliseconds (max 600000), 5-10 words", "<think>plan</think>\n<tool_call>\n{}</tool_call>"):
        assert again.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False), text
    rendered = tok.apply_chat_template(prompt.messages, tools=prompt.tools, tokenize=False)
    assert again.apply_chat_template(prompt.messages, tools=prompt.tools, tokenize=False) == rendered
    assert again(rendered)["input_ids"] == tok(rendered)["input_ids"]
