"""Teacher scorers: HF batching against a per-sequence computation, clamping, routing, LoRA adapters."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import httpx
import pytest
import torch
from transformers import PreTrainedTokenizerBase

from rollout.policy.models import tiny_model
from teachers.scoring import EndpointScorer, HFScorer, LoRAScorer, RoutingScorer, clamp
from teachers.types import DOMAINS, EFFORTS, ScoreRequest, ScoreResult, ScoringError, UnknownCell, cell_key

pytestmark = pytest.mark.unit

CELLS = [cell_key(d, e) for d in DOMAINS for e in EFFORTS]


def reference_logprobs(model: torch.nn.Module, ids: tuple[int, ...], positions: tuple[int, ...]) -> list[float]:
    """One sequence, no padding: log_softmax of the full logits, read at each position."""
    with torch.no_grad():
        logits_TV = model(input_ids=torch.tensor([ids])).logits[0].float()
    logp_TV = torch.log_softmax(logits_TV, dim=-1)
    return [float(logp_TV[p - 1, ids[p]]) for p in positions]


def _requests(n: int, vocab: int, seed: int = 0, cells: list[str] | None = None) -> list[ScoreRequest]:
    rng = random.Random(seed)
    out = []
    for k in range(n):
        length = rng.randint(3, 40)
        ids = tuple(rng.randrange(vocab) for _ in range(length))
        positions = tuple(sorted(rng.sample(range(1, length), rng.randint(1, length - 1))))
        out.append(ScoreRequest((cells or CELLS)[k % len(cells or CELLS)], ids, positions, f"s{k}"))
    return out


@pytest.fixture(scope="module")
def model(tok: PreTrainedTokenizerBase) -> torch.nn.Module:
    return tiny_model(seed=1, tokenizer=tok)[0]


@pytest.mark.parametrize("batch_tokens", [1, 64, 100_000])
def test_hf_scorer_equals_a_per_sequence_computation(model: torch.nn.Module, batch_tokens: int) -> None:
    reqs = _requests(7, model.config.vocab_size)
    got = HFScorer(model, batch_tokens=batch_tokens, device="cpu").score(reqs)
    for req, res in zip(reqs, got):
        want = reference_logprobs(model, req.token_ids, req.positions)
        assert res.clamped == 0 and len(res.logprobs) == len(req.positions)
        assert max(abs(a - b) for a, b in zip(res.logprobs, want)) < 1e-5


def test_position_zero_and_positions_past_the_end_are_refused(model: torch.nn.Module) -> None:
    scorer = HFScorer(model)
    with pytest.raises(ScoringError, match=r"positions of s9 .*\[1, 3\) \(position 0 has no context\), got 0"):
        scorer.score([ScoreRequest("coding/low", (1, 2, 3), (0, 1), "s9")])
    with pytest.raises(ScoringError, match="got 3"):
        scorer.score([ScoreRequest("coding/low", (1, 2, 3), (3,), "s9")])
    assert scorer.score([ScoreRequest("coding/low", (1, 2, 3), ())]) == [ScoreResult(())]


def test_minus_inf_and_nan_logprobs_are_clamped_and_counted(tok: PreTrainedTokenizerBase) -> None:
    model = tiny_model(seed=2, tokenizer=tok)[0]
    banned = 7

    def mask_banned(_: torch.nn.Module, __: object, out: torch.Tensor) -> torch.Tensor:
        out = out.clone()
        out[..., banned] = -math.inf  # a masked vocabulary entry: log p = -inf
        return out

    def poison(_: torch.nn.Module, __: object, out: torch.Tensor) -> torch.Tensor:
        out = out.clone()
        out[:, 3, :] = math.nan  # a NaN final state at one position (a bf16 overflow): its prediction is NaN
        return out

    model.get_output_embeddings().register_forward_hook(mask_banned)
    model.model.norm.register_forward_hook(poison)
    ids = (3, banned, 5, banned, 11, 9)
    (res,) = HFScorer(model, floor=-123.0).score([ScoreRequest("general/max", ids, (1, 2, 3, 4, 5))])
    assert res.clamped == 3
    assert res.logprobs[0] == res.logprobs[2] == res.logprobs[3] == -123.0  # banned, banned, after the NaN state
    assert all(math.isfinite(v) and -123.0 < v < 0 for v in (res.logprobs[1], res.logprobs[4]))
    assert clamp([float("nan"), -1.5, -math.inf], floor=-9.0) == ScoreResult((-9.0, -1.5, -9.0), 2)


class _Recorder:
    """A fake backend: answers each request with its positions as negative numbers, records its calls."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def score(self, requests):  # type: ignore[no-untyped-def]
        self.calls.append([r.cell for r in requests])
        return [ScoreResult(tuple(-float(p) for p in r.positions)) for r in requests]

    def close(self) -> None:
        pass


def test_a_shuffled_batch_covering_the_nine_cells_is_routed_and_returned_in_order() -> None:
    backends = {c: _Recorder() for c in CELLS[:6]}
    shared = _Recorder()  # three cells on one backend (one LoRA base): called once
    scorers = {**backends, **{c: shared for c in CELLS[6:]}}
    reqs = [ScoreRequest(c, tuple(range(10)), (k % 9 + 1,), f"{c}#{k}") for k, c in enumerate(CELLS * 3)]
    random.Random(4).shuffle(reqs)
    got = RoutingScorer(scorers).score(reqs)
    assert [r.logprobs for r in got] == [(-float(q.positions[0]),) for q in reqs]
    for c, b in backends.items():
        assert b.calls == [[c, c, c]]
    assert len(shared.calls) == 1 and sorted(shared.calls[0]) == sorted(CELLS[6:] * 3)


def test_an_unknown_cell_names_itself_and_the_grids_cells() -> None:
    router = RoutingScorer({c: _Recorder() for c in CELLS})
    with pytest.raises(UnknownCell) as info:
        router.score([ScoreRequest("coding/low", (1, 2), (1,)), ScoreRequest("math/high", (1, 2), (1,), "ep3#0")])
    text = str(info.value)
    assert "'math/high'" in text and "ep3#0" in text and ", ".join(CELLS) in text


def _adapter(tok: PreTrainedTokenizerBase, path: Path, seed: int) -> Path:
    from peft import LoraConfig, get_peft_model

    base = tiny_model(seed=1, tokenizer=tok)[0]
    torch.manual_seed(seed)
    cfg = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(base, cfg).save_pretrained(str(path))
    return path


def test_lora_adapters_differ_and_each_equals_its_merged_weights(tok: PreTrainedTokenizerBase, tmp_path: Path) -> None:
    from peft import PeftModel

    paths = {"coding/low": _adapter(tok, tmp_path / "a", 1), "coding/max": _adapter(tok, tmp_path / "b", 2)}
    scorer = LoRAScorer(tiny_model(seed=1, tokenizer=tok)[0], paths, batch_tokens=128)
    base_reqs = _requests(4, len(tok), seed=5, cells=["coding/low"])
    both = base_reqs + [ScoreRequest("coding/max", r.token_ids, r.positions, r.sample_id + "b") for r in base_reqs]
    random.Random(1).shuffle(both)
    got = dict(zip((r.sample_id for r in both), scorer.score(both)))
    for cell, path in paths.items():
        merged = PeftModel.from_pretrained(tiny_model(seed=1, tokenizer=tok)[0], str(path)).merge_and_unload()
        want = HFScorer(merged).score(base_reqs)
        suffix = "" if cell == "coding/low" else "b"
        for req, w in zip(base_reqs, want):
            assert max(abs(a - b) for a, b in zip(got[req.sample_id + suffix].logprobs, w.logprobs)) < 1e-4
    diffs = [abs(a - b) for r in base_reqs for a, b in zip(got[r.sample_id].logprobs, got[r.sample_id + "b"].logprobs)]
    assert max(diffs) > 1e-2  # two adapters, two teachers
    with pytest.raises(UnknownCell, match=r"'agent/low' \(adapters: coding/low, coding/max\)"):
        scorer.score([ScoreRequest("agent/low", (1, 2), (1,))])



def test_lora_adapters_take_the_base_dtype_unless_told_not_to(tok: PreTrainedTokenizerBase, tmp_path: Path) -> None:
    # peft loads adapters in float32 over a bf16 base; every LoRA layer then casts its input (the H200's slow path)
    paths = {"coding/low": _adapter(tok, tmp_path / "a", 1)}
    reqs = _requests(3, len(tok), seed=5, cells=["coding/low"])
    dtypes, scores = {}, {}
    for mode in ("base", None):
        scorer = LoRAScorer(tiny_model(seed=1, tokenizer=tok)[0].to(torch.bfloat16), paths, batch_tokens=128,
                            mode="peft", adapter_dtype=mode)
        dtypes[mode] = {p.dtype for n, p in scorer.peft_model.named_parameters() if "lora_" in n}
        scores[mode] = scorer.score(reqs)
    assert dtypes == {"base": {torch.bfloat16}, None: {torch.float32}}
    diffs = [abs(a - b) for x, y in zip(scores["base"], scores[None]) for a, b in zip(x.logprobs, y.logprobs)]
    assert max(diffs) < 0.1  # the same teacher, to bf16 rounding
    with pytest.raises(ScoringError, match="adapter_dtype: expected 'base' or None, got 'fp16'"):
        LoRAScorer(tiny_model(seed=1, tokenizer=tok)[0], paths, adapter_dtype="fp16")
    with pytest.raises(ScoringError, match="mode: expected 'merge' or 'peft', got 'fused'"):
        LoRAScorer(tiny_model(seed=1, tokenizer=tok)[0], paths, mode="fused")


def test_lora_merge_mode_scores_as_peft_does_and_leaves_the_base_pristine(tok: PreTrainedTokenizerBase,
                                                                          tmp_path: Path) -> None:
    paths = {"coding/low": _adapter(tok, tmp_path / "a", 1), "coding/max": _adapter(tok, tmp_path / "b", 2)}
    reqs = _requests(4, len(tok), seed=6, cells=["coding/low", "coding/max"])
    base = tiny_model(seed=1, tokenizer=tok)[0]
    before = {k: v.clone() for k, v in base.state_dict().items()}
    merge = LoRAScorer(base, paths, batch_tokens=128)
    for _ in range(3):  # repeated switches: written from the pristine copy each time, no drift
        got = merge.score(reqs)
    after = merge._hf.model.state_dict()
    assert set(after) == set(before) and all(torch.equal(after[k], before[k]) for k in before)
    want = LoRAScorer(tiny_model(seed=1, tokenizer=tok)[0], paths, batch_tokens=128, mode="peft").score(reqs)
    assert max(abs(a - b) for x, y in zip(got, want) for a, b in zip(x.logprobs, y.logprobs)) < 1e-4
    plain = HFScorer(tiny_model(seed=1, tokenizer=tok)[0]).score(reqs)
    assert max(abs(a - b) for x, y in zip(got, plain) for a, b in zip(x.logprobs, y.logprobs)) > 1e-2


def test_lora_merge_mode_refuses_dora_and_names_the_cell(tok: PreTrainedTokenizerBase, tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model

    path = tmp_path / "dora"
    get_peft_model(tiny_model(seed=1, tokenizer=tok)[0], LoraConfig(r=4, target_modules=["q_proj"], use_dora=True,
                                                                     init_lora_weights=False)).save_pretrained(str(path))
    with pytest.raises(ScoringError, match=r"adapters\['agent/max'\].*not plain LoRA.*use mode='peft'"):
        LoRAScorer(tiny_model(seed=1, tokenizer=tok)[0], {"agent/max": str(path)})
    LoRAScorer(tiny_model(seed=1, tokenizer=tok)[0], {"agent/max": str(path)}, mode="peft")  # peft's forward takes it

def _server(prompt_logprobs: list[object]) -> httpx.Client:
    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert body["prompt_logprobs"] == 0 and body["max_tokens"] == 1 and len(body["prompt"]) == 4
        choice = {"index": 0, "text": "x", "finish_reason": "length", "logprobs": None, "prompt_logprobs": prompt_logprobs}
        payload = {"id": "c", "object": "text_completion", "created": 0, "model": body["model"], "choices": [choice]}
        return httpx.Response(200, text=json.dumps(payload))  # json.dumps writes -Infinity / NaN, as Python servers do

    return httpx.Client(transport=httpx.MockTransport(handle))


def test_endpoint_scorer_reads_vllm_prompt_logprobs_and_clamps_non_finite_values() -> None:
    table = [None, {"5": {"logprob": -1.25, "rank": 2, "decoded_token": "a"}, "9": {"logprob": -0.5, "rank": 1}},
             {"6": {"logprob": -math.inf, "rank": 4096}}, {"7": {"logprob": math.nan, "rank": 1}}]
    scorer = EndpointScorer("http://teacher/v1", "coding-high", 5.0, http_client=_server(table), floor=-50.0)
    (res,) = scorer.score([ScoreRequest("coding/high", (1, 5, 6, 7), (1, 2, 3))])
    assert res == ScoreResult((-1.25, -50.0, -50.0), 2)
    with pytest.raises(ScoringError, match=r"prompt_logprobs\[1\] of s1 lacks the actual token 4"):
        scorer.score([ScoreRequest("coding/high", (1, 4, 6, 7), (1,), "s1")])
    short = EndpointScorer("http://teacher/v1", "m", 5.0, http_client=_server([None]))
    with pytest.raises(ScoringError, match="expected a list of 4 entries .* got a list of 1"):
        short.score([ScoreRequest("coding/high", (1, 4, 6, 7), (1,), "s1")])
