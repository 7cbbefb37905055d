"""MOPD: multi-teacher on-policy distillation. Routes each student sample to the teacher of its
(domain, effort) cell and turns teacher logprobs into per-token advantages for the learner's loss."""

from sandboxes.exports import lazy_exports

_EXPORTS = {
    **dict.fromkeys(["DistillConfig", "DistillError", "MOPDConfig", "load_distill_config"], "distill.types"),
    **dict.fromkeys(["mopd_advantage", "token_advantages"], "distill.advantages"),
    **dict.fromkeys(["route", "score_samples"], "distill.routing"),
    "run_distill": "distill.loop",
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
