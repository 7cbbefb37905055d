"""Learner: the one policy-gradient loss, advantages, packing, the ``Trainer`` (one process) and the
FSDP2-sharded ``LearnerGroup`` (Ray actors, one per device), the training loop (SFT -> RL -> eval),
checkpoints and weight publishing.

    from learner import load_train_config, run_training
"""

from sandboxes.exports import lazy_exports

_EXPORTS = {
    **dict.fromkeys(["TrainConfig", "load_train_config"], "learner.train_config"),
    **dict.fromkeys(["LossConfig", "TrainBatch", "TrainItem", "TrainerConfig"], "learner.types"),
    "Trainer": "learner.trainer",
    "LearnerGroup": "learner.group",
    "TrainLoop": "learner.loop",
    "run_training": "learner.job",
    "PolicyModel": "learner.model",
    "policy_loss": "learner.losses",
    "group_advantages": "learner.advantages",
    **dict.fromkeys(["CheckpointPublisher", "ServerReloadPublisher", "WeightPublisher"], "learner.publish"),
    "LearnerError": "learner.errors",
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
