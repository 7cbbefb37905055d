"""Warm-start supervised fine-tuning on oracle trajectories.

Why: a random tiny model never writes a well-formed tool call, so RL would see
reward 0 in every group and learn nothing. A short warm start on oracle
episodes (``ScriptedPolicy`` replayed through the rotated harnesses, rendered
token-exact by the episode runner) teaches the tool-call surface of each
harness; RL then has signal to improve on. The data comes from rollout (the
learner never talks to Docker): a ``Trajectory``'s samples carry token ids and a
loss mask that is 1 exactly on the assistant's tokens, so SFT is cross-entropy
on those tokens and nothing else (system prompt, instruction and tool output
are context, never targets).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from learner.errors import EmptyBatch
from learner.metrics import passed
from learner.model import PolicyModel
from learner.packing import pack
from learner.types import TrainItem
from rollout.types import Trajectory

__all__ = ["SFTStep", "sft_items", "sft_step", "batches"]


def sft_items(trajectories: Sequence[Trajectory], *, only_passed: bool = True) -> list[TrainItem]:
    """One ``TrainItem`` per sample of each (passing) trajectory: its ids, its assistant loss mask.

    A failed oracle episode (a broken sandbox, a verifier that said no) is
    skipped: training to imitate it would teach the failure.
    """
    items: list[TrainItem] = []
    for t in trajectories:
        if only_passed and not (t.trainable and passed(t)):
            continue
        for k, s in enumerate(t.samples):
            if sum(s.loss_mask[1:]) == 0:
                continue
            items.append(TrainItem(
                token_ids=s.token_ids, rollout_logprobs=(0.0,) * len(s.token_ids), loss_mask=s.loss_mask,
                advantage=1.0, sample_id=f"{t.episode_id}/{k}", group_id=f"{t.task_id}/{t.seed}",
                tags={"harness": t.harness, "effort": t.effort, "domain": t.domain, "task": t.task_id},
            ))
    return items


def batches(items: Sequence[TrainItem], batch_size: int, steps: int, seed: int = 0) -> list[list[TrainItem]]:
    """``steps`` batches drawn by epochs of a seeded shuffle (every item once per epoch)."""
    if not items:
        return []
    rng = random.Random(seed)
    order: list[int] = []
    out: list[list[TrainItem]] = []
    for _ in range(steps):
        batch: list[TrainItem] = []
        while len(batch) < min(batch_size, len(items)):
            if not order:
                order = list(range(len(items)))
                rng.shuffle(order)
            batch.append(items[order.pop()])
        out.append(batch)
    return out


@dataclass(frozen=True)
class SFTStep:
    """What one warm-start step reports: mean token cross-entropy and token accuracy on the masked tokens."""

    step: int
    loss: float
    token_accuracy: float
    num_loss_tokens: int


def sft_step(
    model: PolicyModel, optimizer: torch.optim.Optimizer, items: Sequence[TrainItem], step: int,
    *, micro_batch_tokens: int = 2048, grad_clip: float = 1.0,
) -> SFTStep:
    """One optimizer step of token-mean cross-entropy over every loss token of ``items`` (accumulated)."""
    n_tok = sum(it.num_loss_tokens for it in items)
    if n_tok == 0:
        raise EmptyBatch(f"sft_step: items: expected some loss tokens, got {len(items)} items with none")
    model.train()
    optimizer.zero_grad(set_to_none=True)
    total, correct = 0.0, 0.0
    for mb in pack(items, max(micro_batch_tokens, max(len(it) for it in items))):
        mb = mb.to(model.device)
        # The LM head only where there is a target: prompts are ~95% of the tokens and the head
        # (vocab x hidden) is most of a tiny model's FLOPs, so this is a ~2x faster step.
        hidden_BTH = model.lm.model(input_ids=mb.input_ids_BT, position_ids=mb.position_ids_BT, use_cache=False).last_hidden_state
        mask_BT = (mb.loss_mask_BT[:, 1:] > 0) & (mb.position_ids_BT[:, 1:] != 0)
        logits_NV = model.lm.lm_head(hidden_BTH[:, :-1][mask_BT]).float()
        target_N = mb.input_ids_BT[:, 1:][mask_BT]
        logp_NV = torch.log_softmax(logits_NV, dim=-1)
        loss = -logp_NV.gather(-1, target_N[:, None]).sum() / n_tok
        loss.backward()
        total += float(loss.detach())
        with torch.no_grad():
            correct += float((logp_NV.argmax(-1) == target_N).sum())
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return SFTStep(step=step, loss=total, token_accuracy=correct / n_tok, num_loss_tokens=n_tok)
