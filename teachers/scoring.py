"""Teacher scorers: log p_teacher(token_ids[i] | token_ids[:i]) at temperature 1, at requested positions.

Backends, all ``teachers.types.TeacherScorer``:

- ``HFScorer``: an in-process Hugging Face causal LM. Requests are sorted by
  length and packed into right-padded batches of at most ``batch_tokens``
  (padded) tokens; the log-softmax is taken in float32 only at the requested
  positions, so memory is ``positions x vocab``, not ``tokens x vocab``.
- ``LoRAScorer``: one base model in memory with one ``peft`` LoRA adapter per
  cell; each cell's requests are one forward with that cell's adapter merged
  into the weights (``mode="merge"``, exact: written from a pristine copy) or
  ``peft``'s ``set_adapter`` (``mode="peft"``), and ``HFScorer``'s batching.
- ``EndpointScorer``: an OpenAI-compatible server (vLLM, ``agentenv serve``)
  given token-id prompts on ``/v1/completions`` with ``prompt_logprobs``; the
  response's ``choices[0].prompt_logprobs`` is ``[None, {token_id: {logprob,
  rank, decoded_token}}, ...]`` with the actual token always among the keys.
- ``RoutingScorer``: ``{cell: scorer}``; one call per distinct backend, results
  back in request order.

A -inf or NaN logprob (a masked vocabulary entry, a bf16 overflow, a server's
``-inf``) would turn the MOPD advantage into NaN; every backend replaces it by
``floor`` (default -1e4, far below any real logprob yet finite) and counts it
in ``ScoreResult.clamped``. The advantage's own clip bounds its effect.

Position 0 has no context and is refused with ``ScoringError``, as is any
position outside the sequence.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from teachers.types import ScoreRequest, ScoreResult, ScoringError, TeacherScorer, UnknownCell

DEFAULT_FLOOR = -1e4


def clamp(values: Sequence[float], floor: float = DEFAULT_FLOOR) -> ScoreResult:
    """``values`` with every non-finite entry replaced by ``floor``, and how many were."""
    out = tuple(v if math.isfinite(v) else floor for v in (float(x) for x in values))
    return ScoreResult(out, sum(1 for v in values if not math.isfinite(float(v))))


def check_request(req: ScoreRequest, vocab_size: int | None = None) -> None:
    """``ScoringError`` naming the request when a position has no prediction or lies outside the sequence."""
    name = req.sample_id or "<unnamed sample>"
    n = len(req.token_ids)
    for p in req.positions:
        if not 1 <= p < n:
            raise ScoringError(
                f"ScoreRequest.positions of {name} (cell {req.cell!r}): expected positions in [1, {n}) "
                f"(position 0 has no context), got {p}"
            )
    if vocab_size is not None and req.token_ids and not 0 <= min(req.token_ids) <= max(req.token_ids) < vocab_size:
        raise ScoringError(f"ScoreRequest.token_ids of {name} (cell {req.cell!r}): expected ids in [0, {vocab_size})")


class HFScorer:
    """An in-process causal LM as a teacher.

    >>> scorer = HFScorer(model, batch_tokens=8192, device="cpu")          # doctest: +SKIP
    >>> [r.logprobs for r in scorer.score([ScoreRequest("coding/high", ids, (5, 6))])]
    """

    def __init__(self, model: Any, *, batch_tokens: int = 16384, device: str | torch.device | None = None,
                 floor: float = DEFAULT_FLOOR, pad_id: int = 0, autocast: torch.dtype | None = None) -> None:
        """``autocast``: run the forward under ``torch.autocast`` at that dtype (fp32 weights, bf16 compute, as the
        trainer's forward); None: the weights' own dtype."""
        if batch_tokens < 1:
            raise ScoringError(f"HFScorer batch_tokens: expected >= 1, got {batch_tokens}")
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.model = torch.nn.Module.to(model, self.device).eval()
        self.batch_tokens, self.floor, self.pad_id = int(batch_tokens), float(floor), int(pad_id)
        self.vocab_size = int(getattr(model.config, "vocab_size", 0)) or None
        self.autocast = autocast

    def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        for req in requests:
            check_request(req, self.vocab_size)
        results: list[ScoreResult | None] = [None] * len(requests)
        for batch in self._batches(requests):
            for i, values in zip(batch, self._forward([requests[i] for i in batch])):
                results[i] = clamp(values, self.floor)
        return [r if r is not None else ScoreResult(()) for r in results]

    def close(self) -> None:
        """Nothing to release; the model belongs to the caller."""

    def _batches(self, requests: Sequence[ScoreRequest]) -> list[list[int]]:
        """Indices of requests with positions, longest first, in batches of at most ``batch_tokens`` padded tokens."""
        order = sorted((i for i, r in enumerate(requests) if r.positions), key=lambda i: -len(requests[i].token_ids))
        batches: list[list[int]] = []
        for i in order:
            # longest first: the batch's width is its first request's length
            if batches and len(requests[batches[-1][0]].token_ids) * (len(batches[-1]) + 1) <= self.batch_tokens:
                batches[-1].append(i)
            else:
                batches.append([i])
        return batches

    @torch.no_grad()
    def _forward(self, batch: Sequence[ScoreRequest]) -> list[list[float]]:
        width = max(len(r.token_ids) for r in batch)
        ids_BT = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        attn_BT = torch.zeros((len(batch), width), dtype=torch.long)
        for b, r in enumerate(batch):
            ids_BT[b, : len(r.token_ids)] = torch.tensor(r.token_ids, dtype=torch.long)
            attn_BT[b, : len(r.token_ids)] = 1
        ids_BT, attn_BT = ids_BT.to(self.device), attn_BT.to(self.device)
        rows_N = torch.tensor([b for b, r in enumerate(batch) for _ in r.positions], device=self.device)
        pos_N = torch.tensor([p for r in batch for p in r.positions], device=self.device)
        with torch.autocast(self.device.type, dtype=self.autocast or torch.bfloat16, enabled=self.autocast is not None):
            hidden_BTH = self._hidden(ids_BT, attn_BT)
            # position p is predicted from the hidden state at p - 1
            logits_NV = self._head(hidden_BTH[rows_N, pos_N - 1]).float()
        logp_N = torch.log_softmax(logits_NV, dim=-1).gather(1, ids_BT[rows_N, pos_N].unsqueeze(1)).squeeze(1)
        flat = logp_N.cpu().tolist()
        out, at = [], 0
        for r in batch:
            out.append(flat[at : at + len(r.positions)])
            at += len(r.positions)
        return out

    def _hidden(self, ids_BT: torch.Tensor, attn_BT: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=ids_BT, attention_mask=attn_BT, output_hidden_states=True, use_cache=False, logits_to_keep=1)
        return out.hidden_states[-1]

    def _head(self, hidden_NH: torch.Tensor) -> torch.Tensor:
        return self.model.get_output_embeddings()(hidden_NH)


class LoRAScorer:
    """One base model, one LoRA adapter per cell (``peft``); one forward per cell's batch.

    ``adapters`` maps a cell to a saved adapter directory (``save_pretrained``
    of a ``PeftModel``) or to a ``peft.PeftConfig`` (a fresh adapter, the
    identity at LoRA's zero init).

    ``mode``:

    - ``"merge"`` (default): before a cell's batch, every adapted weight is
      written as ``pristine + scale * B A`` (one ``addmm`` with A and B in the
      weight's dtype: the product accumulated in float32 and added to the
      pristine weight before one rounding), so the forward is a plain model's;
      the pristine weights are written back after each ``score``. No drift
      however often the cells switch (every write starts from the pristine
      copy), nearly the speed of separate copies, for one model plus one copy
      of the adapted weights. Plain LoRA only: DoRA, LoRA biases and other
      variants are refused.
    - ``"peft"``: ``set_adapter`` per cell and ``peft``'s unmerged forward,
      one model's memory. ``adapter_dtype``: ``"base"`` (default) casts the
      LoRA weights to the base's floating dtype; ``None`` keeps what ``peft``
      loaded (float32 over a bf16 base: every LoRA layer casts its input).

    Nine Qwen2-0.5B-shaped cells on an H200 (docs/benchmarks.md): ``merge``
    scores at 0.87x the tokens/s of nine bf16 copies, at half their peak
    memory; ``peft`` at 0.60x (0.42x with float32 adapters).
    The base is modified in place (wrapped by ``peft``; in ``merge`` mode
    unwrapped again and left with its pristine weights between calls).

    >>> scorer = LoRAScorer(base, {"coding/high": "runs/experts/coding-high"})   # doctest: +SKIP
    """

    def __init__(self, base_model: Any, adapters: Mapping[str, str | os.PathLike[str] | Any], *,
                 batch_tokens: int = 16384, device: str | torch.device | None = None, floor: float = DEFAULT_FLOOR,
                 mode: str = "merge", adapter_dtype: str | None = "base") -> None:
        from peft import PeftConfig, PeftModel, get_peft_model

        if mode not in ("merge", "peft"):
            raise ScoringError(f"LoRAScorer mode: expected 'merge' or 'peft', got {mode!r}")
        if adapter_dtype not in ("base", None):
            raise ScoringError(f"LoRAScorer adapter_dtype: expected 'base' or None, got {adapter_dtype!r}")
        if not adapters:
            raise ScoringError("LoRAScorer adapters: expected at least one cell -> adapter, got none")
        base_dtype = next((p.dtype for p in base_model.parameters() if p.is_floating_point()), None)
        self.mode = mode
        self.names = {cell: f"cell{i}" for i, cell in enumerate(adapters)}  # peft names may not hold '/' or '.'
        model: Any = None
        for cell, source in adapters.items():
            name = self.names[cell]
            try:
                if isinstance(source, PeftConfig):
                    if model is None:
                        model = get_peft_model(base_model, source, adapter_name=name)
                    else:
                        model.add_adapter(name, source)
                elif model is None:
                    model = PeftModel.from_pretrained(base_model, str(source), adapter_name=name, is_trainable=False)
                else:
                    model.load_adapter(str(source), adapter_name=name, is_trainable=False)
            except (OSError, ValueError) as exc:
                raise ScoringError(f"LoRAScorer adapters[{cell!r}]: cannot load adapter {source!r} ({type(exc).__name__}: {exc})") from exc
        self.peft_model = model
        self._merges: list[tuple[Any, torch.Tensor]] = []  # (peft LoRA layer, its base weight's pristine copy)
        if mode == "merge":
            self._merges = self._merge_targets(model, adapters)
            model = model.unload()  # the plain base: the LoRA layers above keep their A and B
        elif adapter_dtype == "base" and base_dtype is not None:
            for pname, param in model.named_parameters():
                if "lora_" in pname and param.dtype != base_dtype:
                    param.data = param.data.to(base_dtype)
        self._hf = HFScorer(model, batch_tokens=batch_tokens, device=device, floor=floor)

    def _merge_targets(self, model: Any, adapters: Mapping[str, Any]) -> list[tuple[Any, torch.Tensor]]:
        from peft.tuners.lora import LoraLayer

        cell_of = {name: cell for cell, name in self.names.items()}
        targets = []
        for mod_name, mod in model.named_modules():
            if not isinstance(mod, LoraLayer):
                continue
            module: Any = mod
            for name in module.lora_A.keys():
                if module.use_dora.get(name) or module.lora_bias.get(name) or getattr(module, "lora_variant", {}).get(name):
                    raise ScoringError(f"LoRAScorer adapters[{cell_of.get(name, name)!r}] ({adapters.get(cell_of.get(name, ''))!r}): "
                                       f"{mod_name} is not plain LoRA (DoRA, a LoRA bias or another variant); "
                                       "mode='merge' cannot merge it, use mode='peft'")
            weight = module.get_base_layer().weight
            targets.append((module, weight.detach().clone()))
        return targets

    @property
    def cells(self) -> list[str]:
        return list(self.names)

    @torch.no_grad()
    def _write(self, name: str | None) -> None:
        """Adapted weights := pristine (+ the delta of adapter ``name``)."""
        for module, pristine in self._merges:
            weight = module.get_base_layer().weight
            if name is None or name not in module.lora_A.keys():
                weight.copy_(pristine)
            elif getattr(module, "fan_in_fan_out", False):
                weight.copy_((pristine.float() + module.get_delta_weight(name).float()).to(weight.dtype))
            else:  # one kernel: pristine + scale * B @ A, the product accumulated in float32, rounded once
                lora_b, lora_a = module.lora_B[name].weight, module.lora_A[name].weight
                torch.addmm(pristine, lora_b.to(weight.dtype), lora_a.to(weight.dtype), alpha=module.scaling[name],
                            out=weight.data)

    def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        by_cell: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            if req.cell not in self.names:
                raise UnknownCell(f"LoRAScorer: no adapter for cell {req.cell!r} (adapters: {', '.join(self.names)})")
            by_cell.setdefault(req.cell, []).append(i)
        results: list[ScoreResult] = [ScoreResult(())] * len(requests)
        try:
            for cell, idx in by_cell.items():
                if self.mode == "merge":
                    self._write(self.names[cell])
                else:
                    self.peft_model.set_adapter(self.names[cell])
                for i, res in zip(idx, self._hf.score([requests[i] for i in idx])):
                    results[i] = res
        finally:
            if self.mode == "merge" and by_cell:
                self._write(None)
        return results

    def close(self) -> None:
        """Nothing to release; the base model belongs to the caller."""


class EndpointScorer:
    """An OpenAI-compatible server that returns ``prompt_logprobs`` (vLLM's field), through the ``openai`` client.

    One ``/v1/completions`` call per request (prompt = the token ids,
    ``max_tokens`` 1, temperature 1, ``prompt_logprobs`` 0: only the actual
    tokens), up to ``concurrency`` at a time.

    >>> scorer = EndpointScorer("http://127.0.0.1:8000/v1", "coding-high", timeout_s=60)   # doctest: +SKIP
    """

    def __init__(self, base_url: str, model: str, timeout_s: float = 60.0, *, api_key: str = "EMPTY",
                 floor: float = DEFAULT_FLOOR, concurrency: int = 8, max_retries: int = 2, http_client: Any = None) -> None:
        import openai

        if timeout_s <= 0:
            raise ScoringError(f"EndpointScorer timeout_s: expected > 0, got {timeout_s}")
        self.base_url, self.model, self.floor = base_url, model, float(floor)
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=max_retries,
                                    http_client=http_client)
        self._pool = ThreadPoolExecutor(max(1, int(concurrency)), thread_name_prefix="teacher-endpoint")

    def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        for req in requests:
            check_request(req)
        return list(self._pool.map(self._one, requests))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()

    def _one(self, req: ScoreRequest) -> ScoreResult:
        import openai

        if not req.positions:
            return ScoreResult(())
        name = req.sample_id or "<unnamed sample>"
        try:
            resp = self.client.completions.create(
                model=self.model, prompt=list(req.token_ids), max_tokens=1, temperature=1.0,
                extra_body={"prompt_logprobs": 0},
            )
        except openai.OpenAIError as exc:
            raise ScoringError(f"EndpointScorer {self.base_url} ({self.model}): scoring {name} failed: {exc}") from exc
        choice = resp.choices[0] if resp.choices else None
        table = getattr(choice, "prompt_logprobs", None) if choice is not None else None
        if table is None and choice is not None and choice.model_extra:
            table = choice.model_extra.get("prompt_logprobs")
        if not isinstance(table, list) or len(table) != len(req.token_ids):
            got = f"a list of {len(table)}" if isinstance(table, list) else type(table).__name__
            raise ScoringError(
                f"EndpointScorer {self.base_url} ({self.model}): choices[0].prompt_logprobs for {name}: "
                f"expected a list of {len(req.token_ids)} entries (does the server support prompt_logprobs?), got {got}"
            )
        return clamp([self._logprob(table, req, p, name) for p in req.positions], self.floor)

    def _logprob(self, table: list[Any], req: ScoreRequest, pos: int, name: str) -> float:
        entry = table[pos]
        hit = entry.get(str(req.token_ids[pos])) if isinstance(entry, Mapping) else None
        if hit is None:
            raise ScoringError(
                f"EndpointScorer {self.base_url}: prompt_logprobs[{pos}] of {name} lacks the actual token {req.token_ids[pos]}"
            )
        value = hit.get("logprob") if isinstance(hit, Mapping) else hit
        return float("nan") if value is None else float(value)


class RoutingScorer:
    """``{cell: scorer}`` as one scorer: one call per distinct backend, results in request order.

    Cells may share a backend (nine cells on one ``LoRAScorer``); it is called once
    with all of its cells' requests.
    """

    def __init__(self, scorers: Mapping[str, TeacherScorer]) -> None:
        self.scorers = dict(scorers)

    @property
    def cells(self) -> list[str]:
        return list(self.scorers)

    def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        groups: dict[int, tuple[TeacherScorer, list[int]]] = {}
        for i, req in enumerate(requests):
            backend = self.scorers.get(req.cell)
            if backend is None:
                raise UnknownCell(
                    f"no teacher for cell {req.cell!r} (sample {req.sample_id or '<unnamed>'}); "
                    f"the grid's cells: {', '.join(self.scorers) or 'none'}"
                )
            groups.setdefault(id(backend), (backend, []))[1].append(i)
        results: list[ScoreResult] = [ScoreResult(())] * len(requests)
        for backend, idx in groups.values():
            got = backend.score([requests[i] for i in idx])
            if len(got) != len(idx):
                raise ScoringError(f"{type(backend).__name__} returned {len(got)} results for {len(idx)} requests")
            for i, res in zip(idx, got):
                results[i] = res
        return results

    def close(self) -> None:
        seen: set[int] = set()
        for backend in self.scorers.values():
            if id(backend) not in seen:
                seen.add(id(backend))
                backend.close()


__all__ = ["DEFAULT_FLOOR", "EndpointScorer", "HFScorer", "LoRAScorer", "RoutingScorer", "check_request", "clamp"]
