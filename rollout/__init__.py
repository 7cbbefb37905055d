"""Rollout: harnesses, policies, the episode runner, in-process and Ray runners, the scheduler, the
trajectory store, evaluation sweeps and ``agentenv serve``. The episode contract is ``rollout.attempt``.

    from rollout import EpisodeRequest, EpisodeRunner, load_config, run_rollout
"""

from sandboxes.exports import lazy_exports

_EXPORTS = {
    **dict.fromkeys(["EpisodeContext", "EpisodeLost", "EpisodeRequest", "SamplingParams"], "rollout.attempt"),
    "EpisodeRunner": "rollout.episode",
    **dict.fromkeys(
        ["FleetConfig", "RolloutConfig", "RolloutSettings", "load_config"], "rollout.config"
    ),
    **dict.fromkeys(["Sample", "Status", "Trajectory", "Turn"], "rollout.types"),
    "TrajectoryStore": "rollout.store",
    **dict.fromkeys(["InProcessRunner", "RayRunner", "RolloutRunner"], "rollout.runner"),
    "run_rollout": "rollout.job",
    **dict.fromkeys(["Generation", "Policy", "PolicyError"], "rollout.policy.types"),
    **dict.fromkeys(["get_harness", "list_harnesses"], "rollout.harnesses"),
    "RolloutError": "rollout.errors",
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
