"""Toy RL problems with known optima, run on the real learner: advantages, packing, loss, Trainer.

A toy is a tiny Qwen2 model over a 16-token vocabulary, a fixed prompt, and a
reward function of the sampled completion. ``rl_run`` samples groups from the
model itself (ancestral sampling at T = 1, seeded), turns the rewards into
advantages with ``learner.advantages.group_advantages``, and takes
``Trainer.step``s (packing, ``policy_loss``, AdamW) exactly as the training loop
does; only the episode (a sandbox, a harness) is replaced by the reward
function. Used by ``test_toy_rl.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import Qwen2Config

from learner.advantages import group_advantages
from learner.model import PolicyModel
from learner.trainer import Trainer
from learner.types import AdvantageConfig, AdvantageEstimator, LossConfig, TrainerConfig, TrainItem

VOCAB = 16
PROMPT = (1, 2, 3)

Reward = Callable[[tuple[int, ...]], float]


def toy_model(seed: int, *, hidden: int = 32, layers: int = 1) -> PolicyModel:
    config = Qwen2Config(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=2 * hidden, vocab_size=VOCAB, max_position_embeddings=64, tie_word_embeddings=True,
        initializer_range=0.02,
    )
    return PolicyModel.from_config(config, seed=seed)


@torch.no_grad()
def next_logp(model: PolicyModel, prefix: Sequence[int]) -> torch.Tensor:
    """log pi(. | prefix) over the vocabulary, fp32."""
    ids = torch.tensor([list(prefix)])
    logits = model.lm(input_ids=ids, use_cache=False).logits[0, -1].float()
    return torch.log_softmax(logits, dim=-1)


@torch.no_grad()
def sample(
    model: PolicyModel, n: int, n_tokens: int, gen: torch.Generator, prompt: Sequence[int] = PROMPT
) -> list[tuple[list[int], list[float]]]:
    """``n`` completions of ``n_tokens`` tokens with their logprobs (what a rollout records), batched."""
    ids_NT = torch.tensor([list(prompt)] * n)
    logps_NT = torch.zeros(n, 0)
    for _ in range(n_tokens):
        logp_NV = torch.log_softmax(model.lm(input_ids=ids_NT, use_cache=False).logits[:, -1].float(), dim=-1)
        tok_N = torch.multinomial(logp_NV.exp(), 1, generator=gen)
        ids_NT = torch.cat([ids_NT, tok_N], dim=1)
        logps_NT = torch.cat([logps_NT, logp_NV.gather(1, tok_N)], dim=1)
    return [(ids_NT[i, len(prompt):].tolist(), logps_NT[i].tolist()) for i in range(n)]


def item(prompt: Sequence[int], completion: Sequence[int], logps: Sequence[float], adv: float, sid: str) -> TrainItem:
    n = len(prompt)
    return TrainItem(
        token_ids=tuple(prompt) + tuple(completion), rollout_logprobs=(0.0,) * n + tuple(logps),
        loss_mask=(0,) * n + (1,) * len(completion), advantage=adv, sample_id=sid,
    )


def seq_prob(model: PolicyModel, completion: Sequence[int], prompt: Sequence[int] = PROMPT) -> float:
    """pi(completion | prompt), the product over its tokens."""
    total, ids = 0.0, list(prompt)
    for tok in completion:
        total += float(next_logp(model, ids)[tok])
        ids.append(tok)
    return float(torch.tensor(total).exp())


@dataclass
class ToyRun:
    model: PolicyModel
    trainer: Trainer
    mean_reward: list[float]
    #: the probability of the optimum after each step (index 0: before any step)
    p_opt: list[float]

    def steps_to(self, p: float) -> int | None:
        return next((i for i, v in enumerate(self.p_opt) if v >= p), None)


def rl_run(
    reward: Reward, optimum: tuple[int, ...], estimator: AdvantageEstimator, *, seed: int, steps: int, lr: float,
    groups: int = 4, group_size: int = 8, loss: LossConfig | None = None, trainer_cfg: TrainerConfig | None = None,
    model: PolicyModel | None = None, stop_at: float | None = None,
) -> ToyRun:
    """``steps`` RL iterations on the toy; one ``Trainer.step`` on every iteration's whole batch."""
    torch.manual_seed(seed)
    model = model if model is not None else toy_model(seed)
    cfg = trainer_cfg or TrainerConfig(lr=lr, micro_batch_tokens=4096)
    trainer = Trainer(model, loss or LossConfig.grpo(is_correction="none"), cfg)
    adv_cfg = AdvantageConfig(estimator=estimator)
    gen = torch.Generator().manual_seed(10_000 + seed)
    n = len(optimum)
    rewards_mean, p_opt = [], [seq_prob(model, optimum)]
    for step in range(steps):
        flat = sample(model, groups * group_size, n, gen)
        groups_out = [flat[g * group_size:(g + 1) * group_size] for g in range(groups)]
        rewards = [[reward(tuple(c)) for c, _ in g] for g in groups_out]
        advs = group_advantages(rewards, adv_cfg)
        items = [item(PROMPT, c, lp, a, f"{step}/{i}/{j}")
                 for i, (g, ag) in enumerate(zip(groups_out, advs)) for j, ((c, lp), a) in enumerate(zip(g, ag))]
        rewards_mean.append(sum(map(sum, rewards)) / (groups * group_size))
        if any(i.advantage != 0 for i in items):
            trainer.step(items)
        p_opt.append(seq_prob(model, optimum))
        if stop_at is not None and p_opt[-1] >= stop_at:
            break
    return ToyRun(model, trainer, rewards_mean, p_opt)
