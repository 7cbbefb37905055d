"""AgentENV: verifiable tasks in sandboxes, graded by physical checks.

The single-env entry point is ``agentenv.make`` (a ``gymnasium.Env``); the task registry is
``agentenv.get_task`` / ``agentenv.list_tasks``; ``agentenv.check_task`` proves a task. Every public
name is imported on first use, so ``import agentenv`` stays cheap for workers that only need the
contracts in ``agentenv.types``.
"""

from sandboxes.exports import lazy_exports

_EXPORTS = {
    "make": "agentenv.env",
    **dict.fromkeys(["get_task", "list_tasks", "register"], "agentenv.registry"),
    **dict.fromkeys(
        ["Domain", "Episode", "Limits", "Task", "TaskSpec", "Variant", "Verifier", "VerifierResult"], "agentenv.types"
    ),
    **dict.fromkeys(["FolderTask", "PythonTask"], "agentenv.task"),
    **dict.fromkeys(
        ["AgentEnvError", "ConfigError", "TaskNotFound", "TaskSpecError", "BackendNotFound", "HarnessNotFound"],
        "agentenv.errors",
    ),
    **dict.fromkeys(["format_loc", "load_yaml_config"], "agentenv.configs"),
    "check_task": "agentenv.check",
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
