"""The project's own small tokenizer, built offline, with its chat template.

Why our own: tests and demos train tiny models, and nothing may be downloaded
at run time. ``build_tokenizer()`` trains a byte-level BPE (``tokenizers``) on
a corpus generated here -- agent-style prose, shell commands, Python, JSON
tool calls and the harness prompts -- and wraps it as a ``transformers``
``PreTrainedTokenizerFast`` carrying ``CHAT_TEMPLATE``. The result is cached
on disk under a hash of everything that went into it (corpus, template,
vocabulary size, library version), so the second call is a directory load.

Byte-level BPE with no normalizer makes ``decode(encode(text)) == text`` for
every string, which the token-exact episode rendering relies on.

The template renders system/user/assistant/tool messages, tool schemas (one
JSON line each inside ``<tools>``), assistant tool calls as
``<tool_call>{"name", "arguments"}</tool_call>`` (what ``rollout.harnesses``
parses) and thinking as ``<think>...</think>``. It is append-only by default;
``keep_thinking=False`` drops the thinking of every assistant turn but the
last, like some production templates, and exists so the non-append-only path
of ``rollout.harnesses.rendering`` is tested on a real template.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from pathlib import Path

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from rollout.errors import ConfigError
VOCAB_SIZE = 4096
EOT = "<|im_end|>"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", EOT, "<|pad|>")
# Added as whole tokens but *not* special: decode keeps them, so parsers see them.
MARKUP_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tools>", "</tools>")

CHAT_TEMPLATE = (
    "{%- set keep = keep_thinking if keep_thinking is defined else true -%}"
    "{%- set ns = namespace(start=0) -%}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set ns.start = 1 -%}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] -}}"
    "{%- if tools -%}{{- '\\n\\n' -}}{%- endif -%}"
    "{%- elif tools -%}{{- '<|im_start|>system\\n' -}}"
    "{%- endif -%}"
    "{%- if tools -%}"
    "{{- '# Tools\\nTo call a tool write <tool_call>{\"name\": <tool name>, \"arguments\": <JSON object>}</tool_call>.\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>' -}}"
    "{%- endif -%}"
    "{%- if ns.start == 1 or tools -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- for message in messages[ns.start:] -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- set reasoning = message.get('reasoning_content') or '' -%}"
    "{%- if reasoning and (keep or loop.last) -%}{{- '<think>' + reasoning + '</think>\\n' -}}{%- endif -%}"
    "{{- message.get('content') or '' -}}"
    "{%- for call in message.get('tool_calls') or [] -%}"
    "{%- set fn = call['function'] if call['function'] is defined else call -%}"
    "{%- if fn['arguments'] is string -%}{%- set args = fn['arguments'] -%}{%- else -%}{%- set args = fn['arguments'] | tojson -%}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": ' + (fn['name'] | tojson) + ', \"arguments\": ' + args + '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

_WORDS = (
    "the a an to of and in is it for on with that this file test tests function class return value error fix bug "
    "run check read write edit find search list open close line lines path directory module package import from "
    "change update add remove create delete make build install output input result results expected actual failed "
    "passed pass fail task done plan step next first then now let me look at see should will need use using code "
    "python shell command script data json config string number list dict key name type args kwargs self none true "
    "false print count sum total items item index main src lib utils api server client request response user agent "
    "model tool tools call calls workspace sandbox repository commit diff patch hunk context verify answer"
).split()
_COMMANDS = (
    "ls -la", "cat README.md", "pytest -q", "python3 -m pytest tests/", "grep -rn 'def ' src/", "find . -name '*.py'",
    "git status", "git diff", "sed -n '1,80p' src/main.py", "echo $?", "pip list", "wc -l *.py", "head -n 20 data.csv",
    "python3 -c 'print(1 + 1)'", "mkdir -p build && cd build", "rm -rf __pycache__", "cd /workspace && make test",
)
_PY = (
    "def {w}(self, {v}):\n    return {v} + 1\n",
    "import os\nimport sys\n\nfrom pathlib import Path\n",
    "class {W}:\n    def __init__(self, {v}: int) -> None:\n        self.{v} = {v}\n",
    "for {v} in range(10):\n    if {v} % 2 == 0:\n        print({v})\n",
    "with open('{w}.txt') as f:\n    {v} = f.read().splitlines()\n",
    "assert {w}({v}) == {n}, f'expected {n}, got {{{v}}}'\n",
    "try:\n    {w}()\nexcept ValueError as exc:\n    raise RuntimeError(str(exc)) from exc\n",
)


def _corpus(seed: int = 0, n: int = 6000) -> str:
    """Deterministic training text in the shapes the model will see."""
    from rollout.harnesses import get_harness, list_harnesses

    rng = random.Random(seed)
    parts: list[str] = []
    for name in list_harnesses():
        rendered = get_harness(name).render("Fix the failing test.", "high")
        parts.extend(str(m["content"]) for m in rendered.messages)
        parts.extend(json.dumps(t) for t in rendered.tools)
    for _ in range(n):
        w, v = rng.choice(_WORDS), rng.choice(_WORDS)
        kind = rng.random()
        if kind < 0.35:
            sent = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 16)))
            parts.append(sent.capitalize() + rng.choice((".", ".", "?", ":")))
        elif kind < 0.6:
            parts.append(rng.choice(_PY).format(w=w, v=v, W=w.capitalize(), n=rng.randint(0, 999)))
        elif kind < 0.8:
            cmd = rng.choice(_COMMANDS)
            call = {"name": rng.choice(("bash", "Bash", "shell", "Shell")), "arguments": {"command": cmd}}
            parts.append(f"<tool_call>\n{json.dumps(call)}\n</tool_call>")
        else:
            parts.append(f"<think>{' '.join(rng.choice(_WORDS) for _ in range(rng.randint(5, 30)))}</think>\n")
            parts.append(f"{rng.randint(1, 400):>6}\t{rng.choice(_PY).format(w=w, v=v, W=w.upper(), n=1).splitlines()[0]}")
    return "\n".join(parts)


def _cache_root() -> Path:
    return Path(os.environ.get("AGENTENV_CACHE_DIR", Path.home() / ".cache" / "agentenv")) / "tokenizers"


def tokenizer_key(vocab_size: int = VOCAB_SIZE) -> tuple[str, str]:
    """``(content hash, corpus)``: the hash names the cache entry."""
    corpus = _corpus()
    h = hashlib.sha256()
    for piece in (corpus, CHAT_TEMPLATE, str(vocab_size), ",".join(SPECIAL_TOKENS + MARKUP_TOKENS), tokenizers.__version__):
        h.update(piece.encode())
        h.update(b"\0")
    return h.hexdigest()[:16], corpus


def _train(corpus: str, vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((corpus[i : i + 8192] for i in range(0, len(corpus), 8192)), trainer=trainer)
    tok.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    return tok


_LOADED: dict[tuple[int, str], PreTrainedTokenizerFast] = {}


def build_tokenizer(vocab_size: int = VOCAB_SIZE, cache_dir: str | os.PathLike[str] | None = None) -> PreTrainedTokenizerFast:
    """The project tokenizer; trained once per content hash, then loaded from disk.

    >>> tok = build_tokenizer()                       # doctest: +SKIP
    >>> tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    '<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n'
    """
    if not 256 + len(SPECIAL_TOKENS) < vocab_size <= 65536:
        raise ConfigError(f"build_tokenizer: vocab_size must be in (260, 65536], got {vocab_size}")
    root = Path(cache_dir) if cache_dir is not None else _cache_root()
    memo = _LOADED.get((vocab_size, str(root)))
    if memo is not None:
        return memo  # in-process: hashing the corpus again would cost more than the load
    _LOADED[(vocab_size, str(root))] = tok = _build(vocab_size, root)
    return tok


def _build(vocab_size: int, root: Path) -> PreTrainedTokenizerFast:
    key, corpus = tokenizer_key(vocab_size)
    target = root / f"agentenv-bpe-{vocab_size}-{key}"
    if (target / "tokenizer.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(str(target), local_files_only=True)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=_train(corpus, vocab_size),
        eos_token=EOT,
        pad_token="<|pad|>",
        unk_token=None,
        bos_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )
    fast.chat_template = CHAT_TEMPLATE
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tok-", dir=root))
    try:
        fast.save_pretrained(str(tmp))
        try:
            tmp.rename(target)  # atomic: concurrent builders race, one wins, both load the same content
        except OSError:
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return PreTrainedTokenizerFast.from_pretrained(str(target), local_files_only=True)


__all__ = ["CHAT_TEMPLATE", "EOT", "MARKUP_TOKENS", "SPECIAL_TOKENS", "VOCAB_SIZE", "build_tokenizer", "tokenizer_key"]
