"""The teacher context: the student's render without the effort message, the response spliced verbatim."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import PreTrainedTokenizerBase

from agentenv.intents import Intent, IntentResult
from rollout.harnesses import get_harness
from rollout.harnesses.rendering import EpisodeRenderer
from rollout.types import Sample, Status, Trajectory
from teachers.context import prompt_pair, splice, trajectory_contexts
from teachers.types import ContextMismatch

pytestmark = pytest.mark.unit

HARNESSES = ("claude_code", "codex", "kimi_code")
INSTRUCTION = "Fix the failing test in calc.py, then run pytest."


def _episode(tok: PreTrainedTokenizerBase, harness_name: str, effort: str, instruction: str = INSTRUCTION,
             template_kwargs: dict[str, Any] | None = None) -> list[Sample]:
    """Two turns through EpisodeRenderer: a shell call, its result, then a final text turn."""
    harness = get_harness(harness_name)
    prompt = harness.render(instruction, effort)
    r = EpisodeRenderer(tok, prompt.messages, prompt.tools, template_kwargs=template_kwargs)
    call = harness.from_intent(Intent("exec_shell", {"command": "pytest -q"}, call_id="call_1"))
    text = harness.render_call(call)
    eot = r.eot_id
    ids = list(tok.encode("<think>run the tests first</think>\n" + text, add_special_tokens=False)) + [eot]
    msg = {"role": "assistant", "content": "", "reasoning_content": "run the tests first",
           "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": call.name, "arguments": dict(call.arguments)}}]}
    r.add_completion(ids, msg, [-0.5] * len(ids))
    result = IntentResult(Intent("exec_shell", {"command": "pytest -q"}, call_id="call_1", tool=call.name), ok=True, output="1 passed", exit_code=0)
    r.add_observations([harness.format_result(result)])
    final = list(tok.encode("<think>done</think>\nAll tests pass.", add_special_tokens=False)) + [eot]
    r.add_completion(final, {"role": "assistant", "content": "All tests pass.", "reasoning_content": "done"}, [-0.25] * len(final))
    return [Sample(tuple(s.ids), tuple(s.logprobs), tuple(s.mask)) for s in r.samples]


@pytest.mark.parametrize("harness", HARNESSES)
@pytest.mark.parametrize("effort", ["low", "max"])
def test_teacher_context_drops_only_the_effort_message_and_aligns_one_to_one(
    tok: PreTrainedTokenizerBase, harness: str, effort: str
) -> None:
    (sample,) = _episode(tok, harness, effort)
    s_ids, t_ids = prompt_pair(tok, harness, INSTRUCTION, effort)
    effort_text = get_harness(harness).effort_text(effort)
    assert effort_text in tok.decode(s_ids) and effort_text not in tok.decode(t_ids)
    assert len(t_ids) < len(s_ids)

    ctx = splice("coding/" + effort, sample.token_ids, sample.loss_mask, s_ids, t_ids, sample_id="ep#0")
    req = ctx.request
    student_pos = [i for i, m in enumerate(sample.loss_mask) if m]
    assert ctx.student_positions == tuple(student_pos) and len(student_pos) > 10
    assert len(req.positions) == len(student_pos)
    # one to one: the teacher scores exactly the tokens the student sampled
    assert [req.token_ids[p] for p in req.positions] == [sample.token_ids[p] for p in student_pos]
    # the response (everything after the prompt) is the student's, verbatim
    assert req.token_ids[len(t_ids):] == sample.token_ids[len(s_ids):]
    assert list(req.token_ids[: len(t_ids)]) == t_ids
    # and the teacher prompt is what an episode run without effort would have tokenized
    assert list(req.token_ids[: len(t_ids)]) == EpisodeRenderer(
        tok, get_harness(harness).render(INSTRUCTION, None).messages, get_harness(harness).render(INSTRUCTION, None).tools
    ).prompt_ids()
    assert ctx.shift == len(t_ids) - len(s_ids) and req.cell == "coding/" + effort and req.sample_id == "ep#0"


def test_a_sample_from_another_prompt_is_a_mismatch_naming_it(tok: PreTrainedTokenizerBase) -> None:
    (sample,) = _episode(tok, "codex", "high", instruction="Something else entirely.")
    s_ids, t_ids = prompt_pair(tok, "codex", INSTRUCTION, "high")
    with pytest.raises(ContextMismatch, match=r"sample ep7#0: the re-rendered student prompt .* not a prefix"):
        splice("coding/high", sample.token_ids, sample.loss_mask, s_ids, t_ids, sample_id="ep7#0")


def test_a_masked_prompt_token_or_a_short_mask_is_refused() -> None:
    with pytest.raises(ContextMismatch, match="marks prompt position 1 as sampled"):
        splice("a/low", [1, 2, 3, 4], [0, 1, 0, 1], [1, 2], [1], sample_id="s")
    with pytest.raises(ContextMismatch, match="loss_mask has 3 entries for 4 token ids"):
        splice("a/low", [1, 2, 3, 4], [0, 0, 1], [1, 2], [1], sample_id="s")


def test_later_samples_of_a_non_append_only_template_are_spliced_after_the_same_opening(tok: PreTrainedTokenizerBase) -> None:
    kwargs = {"keep_thinking": False}
    samples = _episode(tok, "kimi_code", "high", template_kwargs=kwargs)
    assert len(samples) == 2  # the template dropped the first turn's thinking: a second sample
    s_ids, t_ids = prompt_pair(tok, "kimi_code", INSTRUCTION, "high", template_kwargs=kwargs)
    for k, sample in enumerate(samples):
        ctx = splice("agent/high", sample.token_ids, sample.loss_mask, s_ids, t_ids, sample_id=f"e#{k}")
        masked = [i for i, m in enumerate(sample.loss_mask) if m]
        assert masked and [ctx.request.token_ids[p] for p in ctx.request.positions] == [sample.token_ids[p] for p in masked]


def test_trajectory_contexts_recreate_the_instruction_from_the_registry(tok: PreTrainedTokenizerBase) -> None:
    from agentenv.registry import get_task

    task_id, seed = "coding/fix_bug", 3
    instruction = get_task(task_id).variant(seed).instruction
    samples = _episode(tok, "claude_code", "low", instruction=instruction)
    traj = Trajectory(episode_id="ep42", run_id="r", task_id=task_id, domain="coding", seed=seed, harness="claude_code",
                      effort="low", policy_version=0, status=Status.OK, reward=1.0, samples=tuple(samples))
    (ctx,) = trajectory_contexts(tok, traj)
    assert ctx.request.cell == "coding/low" and ctx.request.sample_id == "ep42#0"
    assert [ctx.request.token_ids[p] for p in ctx.request.positions] == [samples[0].token_ids[p] for p in ctx.student_positions]
    wrong_seed = Trajectory(**{**traj.__dict__, "seed": seed + 1})
    if get_task(task_id).variant(seed + 1).instruction != instruction:
        with pytest.raises(ContextMismatch, match="ep42#0"):
            trajectory_contexts(tok, wrong_seed)
    with pytest.raises(ContextMismatch, match="real CLI"):
        trajectory_contexts(tok, Trajectory(**{**traj.__dict__, "harness": "cli:codex"}))
