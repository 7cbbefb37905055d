"""The RL demo tasks (tag ``rl_demo``) keep the properties their comments promise.

``general/count_lines`` (the quickstart's task): one command solves every variant
and the instruction does not give the answer away. ``general/write_word``: its
words are each one token of the project tokenizer, the same token in the
instruction and after ``echo``, and no harness prompt contains them, so the
word is the one such token a model sees.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import agentenv.tasks.builtin as builtin_pkg
from agentenv.task import FolderTask
from rollout.harnesses import get_harness
from rollout.tokenizer import build_tokenizer

pytestmark = pytest.mark.unit

ROOT = Path(builtin_pkg.__path__[0])
HARNESSES = ("claude_code", "codex", "kimi_code")


def _task(task_id: str) -> FolderTask:
    return FolderTask.load(ROOT / task_id)


def test_count_lines_has_one_command_for_every_variant_and_hides_the_count() -> None:
    task = _task("general/count_lines")
    variants = [task.variant(seed) for seed in range(40)]
    assert len({v.params["lines"] for v in variants}) > 10  # the variants do differ
    assert len({task.oracle_script(v) for v in variants}) == 1
    assert len({v.instruction for v in variants}) == 1
    assert "rl_demo" in task.spec.tags


def test_write_word_words_are_single_tokens_found_only_in_the_instruction() -> None:
    task = _task("general/write_word")
    tok = build_tokenizer()
    words = task.spec.params["word"].choices
    ids = {w: tok.convert_tokens_to_ids("Ġ" + w) for w in words}
    assert tok.unk_token_id not in ids.values() and None not in ids.values()
    for seed in range(16):
        v = task.variant(seed)
        word = v.params["word"]
        assert ids[word] in tok(v.instruction)["input_ids"]
        assert ids[word] in tok(task.oracle_script(v) or "")["input_ids"]
    for name in HARNESSES:
        prompt = get_harness(name).render("Write the word X to the file /workspace/answer.txt.", "high")
        text = tok.apply_chat_template(prompt.messages, tools=prompt.tools, tokenize=False)
        assert not set(ids.values()) & set(tok(text)["input_ids"]), name
