"""Teachers: the domain x effort grid (``TeacherGridConfig``), effort budgets, and teacher scoring
(a local model, LoRA adapters on one base, or a logprob endpoint) behind ``TeacherScorer``."""

from sandboxes.exports import lazy_exports

_EXPORTS = {
    **dict.fromkeys(
        ["DOMAINS", "EFFORTS", "ScoreRequest", "ScoreResult", "TeacherError", "TeacherScorer", "cell_key"],
        "teachers.types",
    ),
    **dict.fromkeys(["TeacherGridConfig", "build_scorer"], "teachers.grid"),
    **dict.fromkeys(["EndpointScorer", "HFScorer", "LoRAScorer", "RoutingScorer"], "teachers.scoring"),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
