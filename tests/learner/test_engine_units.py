"""The engine's contracts without sandboxes: the staleness check where the learner reads, the config's
one-place-each rule, checkpoints written atomically and loaded strictly, the turn gate."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch

from learner.checkpoint import EngineState, RunCheckpoints, config_hash
from learner.errors import CheckpointMismatch, CheckpointNotFound, LearnerConfigError
from learner.advantages import items_from_groups
from learner.loop import check_staleness, check_trained, fresh_for_learner
from learner.types import AdvantageConfig
from learner.types import TrainItem
from learner.model import PolicyModel
from learner.train_config import TrainConfig, load_train_config
from learner.trainer import Trainer
from learner.types import LossConfig, TrainerConfig
from rollout.errors import StalenessError
from rollout.gate import TurnGate
from rollout.types import Sample, Status, Trajectory, Turn

pytestmark = [pytest.mark.unit]


def _traj(eid: str, version: int, *, turns: tuple[int, ...] = (), status: Status = Status.OK) -> Trajectory:
    return Trajectory(eid, "r", "t", "general", 0, "codex", "high", version, status, 1.0,
                      turns=tuple(Turn(i, v) for i, v in enumerate(turns or (version,))))


def test_the_learner_reads_only_samples_within_k_versions_and_the_check_names_the_offender() -> None:
    trajs = [_traj("a", 5), _traj("b", 4), _traj("c", 2, turns=(2, 4, 5)), _traj("d", 5, status=Status.INVALID)]
    fresh, stale = fresh_for_learner(trajs, version=5, max_lag=1)
    assert [t.episode_id for t in fresh] == ["a", "b"] and stale == 1  # c started at 2: its oldest turn counts
    assert check_staleness(fresh, 5, 1) == 1
    with pytest.raises(StalenessError, match=r"episode c .* version 2, 3 behind, over the bound rollout.staleness.max_lag=1"):
        check_staleness(trajs, 5, 1)
    assert fresh_for_learner(trajs, 5, 0)[0] == [trajs[0]]  # K = 0: only the current version


def _sampled(eid: str, version: int, reward: float, *, status: Status = Status.OK) -> Trajectory:
    return Trajectory(eid, "r", "t", "general", 0, "codex", "high", version, status, reward,
                      samples=(Sample((1, 2, 3), (0.0, -0.5, -0.5), (0, 1, 1)),), turns=(Turn(0, version),))


def test_the_staleness_check_fires_on_what_is_trained_not_on_the_filtered_list() -> None:
    """Before issue 26 the check ran on ``fresh_for_learner``'s output, filtered by the same rule: it could not fire."""
    batch = [_sampled("a", 5, 1.0), _sampled("b", 5, 0.0), _sampled("old", 2, 1.0), _sampled("old2", 2, 0.0),
             _sampled("inv", 5, 0.0, status=Status.INVALID)]
    cfg = AdvantageConfig()
    fresh, stale = fresh_for_learner(batch, version=5, max_lag=1)
    assert stale == 2
    assert check_trained(items_from_groups([fresh], cfg), batch, 5, 1) == 0  # the filtered batch is within K
    leaked = items_from_groups([batch[:4]], cfg)  # a filter (or an advantage provider) that let the stale pair through
    with pytest.raises(StalenessError, match=r"episode old was sampled by version 2, 3 behind, over the bound .*max_lag=1"):
        check_trained(leaked, batch, 5, 1)
    with pytest.raises(StalenessError, match=r"training item 'ghost/0' comes from no episode of this batch"):
        check_trained([TrainItem((1,), (0.0,), (1,), 1.0, sample_id="ghost/0")], batch, 5, 1)
    with pytest.raises(StalenessError, match=r"episode inv with status invalid, which is never trained on"):
        check_trained([TrainItem((1,), (0.0,), (1,), 1.0, sample_id="inv#0")], batch, 5, 1)


def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "train.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ("rollout: {sampling: {temperature: 0.7}}\nrl: {loss: {temperature: 1.0}}",
         ["rl.loss.temperature", "rollout.sampling.temperature"]),
        ("rollout: {staleness: {max_lag: 0}}\nrl: {partial_rollouts: true}", ["rl.partial_rollouts", "rollout.staleness.max_lag"]),
        ("rollout: {run_id: other}", ["rollout.run_id", "run_id"]),
        ("rollout: {seeds: [1, 2]}", ["rollout.seeds", "train_seeds"]),
        ("rollout: {policy: {kind: scripted}}", ["rollout.policy"]),
        ("rollout: {group_size: 1}", ["rollout.group_size"]),
        ("trainer: {lr: -1}", ["trainer.lr"]),
        ("rollout: {efforts: {levels: [huge]}}", ["rollout", "huge"]),
    ],
)
def test_a_conflicting_or_bad_setting_names_its_fields(tmp_path: Path, body: str, named: list[str]) -> None:
    with pytest.raises(LearnerConfigError) as err:
        load_train_config(_yaml(tmp_path, "run_id: x\n" + body))
    for field in named:
        assert field in str(err.value), str(err.value)
    assert "train.yaml" in str(err.value)


def test_the_loss_scores_at_the_sampling_temperature_unless_given_equal(tmp_path: Path) -> None:
    cfg = load_train_config(_yaml(tmp_path, "run_id: x\nrollout: {sampling: {temperature: 0.7}}"))
    assert cfg.loss_config().temperature == 0.7 and cfg.rl.loss.temperature == 1.0  # derived, the field untouched
    same = load_train_config(_yaml(tmp_path, "run_id: x\nrollout: {sampling: {temperature: 0.7}}\nrl: {loss: {temperature: 0.7}}"))
    assert same.loss_config().temperature == 0.7


def test_trainer_and_model_device_options_are_reachable_from_the_yaml(tmp_path: Path) -> None:
    cfg = load_train_config(_yaml(tmp_path, "\n".join([
        "run_id: x",
        "model: {device: cuda, rollout_device: cpu, checkpoint: /models/qwen}",
        "trainer: {lr: 1.0e-6, bf16: true, pad_to_multiple: 4096, rows_per_micro_batch: 4, logprob_chunk_tokens: 1024,",
        "          logprob_keep_logits: true, logprobs_at_loss_tokens: true, compile_layers: true, fused_optimizer: true}",
    ])))
    t = cfg.trainer
    assert (cfg.model.device, cfg.model.checkpoint, t.bf16, t.rows_per_micro_batch, t.compile_layers) == (
        "cuda", "/models/qwen", True, 4, True)


def _state(it: int, **kw: object) -> EngineState:
    fields = dict(run_id="r-1", config_hash="h", iteration=it, version=it, episode_index=3 * it, planned_batches=it,
                  rng=[3, [1, 2], None], pending=[], trained=[f"e{i}" for i in range(it)], history={}, evals_done=1)
    return EngineState(**(fields | kw))  # type: ignore[arg-type]


def test_checkpoints_rotate_atomically_and_a_half_written_one_is_never_taken(tmp_path: Path) -> None:
    ck = RunCheckpoints(tmp_path, keep=2)
    assert ck.latest() is None
    for it in (1, 2, 3):
        ck.write(it, _state(it), lambda d: (d.mkdir(parents=True), (d / "w").write_text("x")))
    assert sorted(p.name for p in tmp_path.glob("iter-*")) == ["iter-000002", "iter-000003"]
    assert ck.latest() == tmp_path / "iter-000003" and ck.read_state(ck.latest()).iteration == 3

    def crash(d: Path) -> None:  # killed while writing iteration 4
        d.mkdir(parents=True)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ck.write(4, _state(4), crash)
    assert (tmp_path / "iter-000004.tmp").is_dir()
    assert ck.latest() == tmp_path / "iter-000003"  # the previous one is still the newest complete checkpoint


def test_checkpoints_load_strictly(tmp_path: Path) -> None:
    ck = RunCheckpoints(tmp_path, keep=1)
    path = ck.write(1, _state(1), lambda d: d.mkdir(parents=True))
    data = json.loads((path / "engine.json").read_text())
    (path / "engine.json").write_text(json.dumps(data | {"surprise": 1}))
    with pytest.raises(CheckpointMismatch, match="surprise"):
        ck.read_state(path)
    ck.write_run("r-1", "aaaa")
    assert ck.read_run("aaaa") == "r-1"
    with pytest.raises(CheckpointMismatch, match="different config"):
        ck.read_run("bbbb")
    with pytest.raises(CheckpointNotFound, match="no run to resume"):
        RunCheckpoints(tmp_path / "none").read_run("aaaa")


def test_config_hash_ignores_where_the_run_goes_not_what_it_learns() -> None:
    a = TrainConfig(run_id="x", store="sqlite:///a.db").model_dump(mode="json")
    b = TrainConfig(run_id="x", store="sqlite:///b.db", out_dir="elsewhere").model_dump(mode="json")
    c = TrainConfig(run_id="x", trainer={"lr": 5e-4}).model_dump(mode="json")
    assert config_hash(a) == config_hash(b) != config_hash(c)


def test_trainer_checkpoint_is_hugging_face_format_and_loads_strictly(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    from rollout.policy.models import tiny_config
    from rollout.tokenizer import build_tokenizer

    tok = build_tokenizer()
    model = PolicyModel.from_config(tiny_config(tok, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1), seed=0)
    trainer = Trainer(model, LossConfig(), TrainerConfig(lr=1e-3))
    trainer.save(tmp_path / "ck")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "ck" / "model", local_files_only=True)
    assert torch.equal(hf.get_input_embeddings().weight, model.lm.get_input_embeddings().weight)
    other = Trainer(PolicyModel.from_config(tiny_config(tok, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1), seed=1),
                    LossConfig(), TrainerConfig(lr=1e-3))
    other.load(tmp_path / "ck")
    assert torch.equal(other.model.lm.get_input_embeddings().weight, model.lm.get_input_embeddings().weight)
    shard = next((tmp_path / "ck" / "model").glob("*.safetensors"))
    tensors = load_file(str(shard))
    dropped = next(k for k in tensors if "layers.0" in k)
    save_file({k: v for k, v in tensors.items() if k != dropped}, str(shard), metadata={"format": "pt"})
    with pytest.raises(CheckpointMismatch, match="lacks tensors"):
        other.load(tmp_path / "ck")


def test_turn_gate_holds_turns_while_closed_and_reports_the_wait() -> None:
    async def main() -> tuple[float, float, int]:
        gate = TurnGate()
        assert await gate.wait() == 0.0
        gate.close()
        waiter = asyncio.ensure_future(gate.wait())
        await asyncio.sleep(0.05)
        assert not waiter.done() and gate.waiting == 1
        gate.open()
        return 0.0, await waiter, gate.paused_total

    _, waited, paused = asyncio.run(main())
    assert waited >= 0.04 and paused == 1


def test_the_learner_side_never_imports_a_sandbox_backend() -> None:
    import subprocess
    import sys

    code = ("import sys, learner.loop, learner.job, learner.checkpoint, benches.engine; "
            "bad = sorted(m for m in sys.modules if m in ('docker',) or m.startswith('sandboxes.docker') "
            "or m.startswith('sandboxes.local_backend')); print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("name", ["quickstart.yaml", "train_ray.yaml"])
def test_the_example_training_configs_load(name: str) -> None:
    cfg = load_train_config(Path(__file__).resolve().parents[2] / "examples" / name)
    assert cfg.rl.iterations >= 1 and cfg.rollout.group_size >= 2


def test_carried_moments_keep_the_rl_warmup() -> None:
    from learner.loop import carry_moments
    from rollout.policy.models import tiny_config
    from rollout.tokenizer import build_tokenizer

    model = PolicyModel.from_config(tiny_config(build_tokenizer(), hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1), seed=0)
    sft = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.lm.get_input_embeddings().weight.sum().backward()
    sft.step()
    trainer = Trainer(model, LossConfig(), TrainerConfig(lr=5e-4, warmup_steps=4))
    carry_moments(trainer, sft)
    assert trainer.optimizer.state_dict()["state"]  # the moments came over
    assert [g["lr"] for g in trainer.optimizer.param_groups] == [pytest.approx(5e-4 / 4)]  # warmup step 1 of 4
    trainer.scheduler.step()
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(5e-4 * 2 / 4)


def test_sampling_seeds_do_not_depend_on_the_run_id_that_holds_the_start_time() -> None:
    """The same config and seed sample the same tokens whenever the run starts (the run id holds its time)."""
    from learner.loop import eval_requests
    from rollout.policy.types import SamplingParams

    cfg = TrainConfig(run_id="x", eval={"seeds": {"start": 10_000, "count": 4}, "temperature": 1.0})
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8)
    a = eval_requests(cfg, ["general/count_lines"], "x-20261202-040000", 0, sampling=sampling)
    b = eval_requests(cfg, ["general/count_lines"], "x-20261202-050000", 0, sampling=sampling)
    assert [r.episode_id for r in a] != [r.episode_id for r in b]
    assert [r.sampling.seed for r in a] == [r.sampling.seed for r in b]
    assert len({r.sampling.seed for r in a}) == 4, "episodes of one evaluation must not share a seed"
    other = eval_requests(cfg.model_copy(update={"seed": 1}), ["general/count_lines"], "x", 0, sampling=sampling)
    assert [r.sampling.seed for r in other] != [r.sampling.seed for r in a]
