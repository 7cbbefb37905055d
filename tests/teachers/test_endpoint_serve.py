"""``agentenv serve``'s prompt_logprobs, for real: the official openai client, EndpointScorer against HFScorer."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
import torch
from transformers import PreTrainedTokenizerBase

from rollout.policy.hf import HFPolicy
from rollout.policy.models import load_checkpoint, save_checkpoint, tiny_model
from rollout.serve import create_app, serve_in_thread
from teachers.scoring import EndpointScorer, HFScorer
from teachers.types import ScoreRequest


def _requests(vocab: int, n: int = 5) -> list[ScoreRequest]:
    rng = random.Random(7)
    out = []
    for k in range(n):
        ids = tuple(rng.randrange(vocab) for _ in range(rng.randint(4, 30)))
        out.append(ScoreRequest("coding/high", ids, tuple(range(1, len(ids))), f"s{k}"))
    return out


@pytest.mark.unit
def test_prompt_logprobs_through_the_openai_client_match_the_hf_scorer(tok: PreTrainedTokenizerBase) -> None:
    model = tiny_model(seed=3, tokenizer=tok)[0]
    reqs = _requests(len(tok))
    with serve_in_thread(create_app(HFPolicy(model, tok), "teacher")) as base:
        client = openai.OpenAI(base_url=base, api_key="EMPTY", max_retries=0, timeout=30)
        ids = list(reqs[0].token_ids)
        r = client.completions.create(model="teacher", prompt=ids, max_tokens=1, temperature=0.3,
                                      extra_body={"prompt_logprobs": 1})
        table = r.choices[0].model_extra["prompt_logprobs"]  # type: ignore[index]
        assert len(table) == len(ids) and table[0] is None
        for pos in range(1, len(ids)):
            entry = table[pos]
            assert str(ids[pos]) in entry and 1 <= len(entry) <= 2
            top = [v for v in entry.values() if v["rank"] == 1]
            assert len(top) == 1 and top[0]["logprob"] >= entry[str(ids[pos])]["logprob"]
            assert entry[str(ids[pos])]["decoded_token"] == tok.decode([ids[pos]])

        endpoint = EndpointScorer(base, "teacher", timeout_s=30)
        try:
            got = endpoint.score(reqs)
        finally:
            endpoint.close()
        # the server's table is at temperature 1 whatever the request's temperature
        assert [table[p][str(ids[p])]["logprob"] for p in reqs[0].positions] == pytest.approx(got[0].logprobs, abs=1e-6)
        with pytest.raises(openai.BadRequestError, match=r"prompt_logprobs: expected an int in \[0, 20\] or null, got -1"):
            client.completions.create(model="teacher", prompt=ids, max_tokens=1, extra_body={"prompt_logprobs": -1})
        plain = client.completions.create(model="teacher", prompt=ids, max_tokens=1)
        assert plain.choices[0].model_extra["prompt_logprobs"] is None  # type: ignore[index]
    want = HFScorer(model, batch_tokens=64).score(reqs)
    for g, w in zip(got, want):
        assert g.clamped == w.clamped == 0
        assert max(abs(a - b) for a, b in zip(g.logprobs, w.logprobs)) < 1e-4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_agentenv_serve_cli_scores_a_checkpoint_like_the_hf_scorer(tok: PreTrainedTokenizerBase, tmp_path: Path) -> None:
    ckpt = save_checkpoint(tiny_model(seed=4, tokenizer=tok)[0], tok, tmp_path / "teacher")
    port = _free_port()
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "agentenv.cli", "serve", str(ckpt), "--port", str(port), "--served-name", "t"],
                            stdout=subprocess.DEVNULL, stderr=log)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        client = openai.OpenAI(base_url=base, api_key="EMPTY", max_retries=0, timeout=5)
        deadline = time.monotonic() + 120
        while True:
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                assert proc.poll() is None, (tmp_path / "serve.log").read_text()
                assert time.monotonic() < deadline, "agentenv serve did not come up within 120s"
                time.sleep(0.2)
        reqs = _requests(len(tok), n=3)
        endpoint = EndpointScorer(base, "t", timeout_s=30)
        try:
            got = endpoint.score(reqs)
        finally:
            endpoint.close()
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    torch.set_num_threads(1)
    want = HFScorer(load_checkpoint(ckpt)[0]).score(reqs)
    for g, w in zip(got, want):
        assert max(abs(a - b) for a, b in zip(g.logprobs, w.logprobs)) < 1e-4
