"""Evaluation sweeps: ``agentenv eval SWEEP.yaml`` / ``python -m rollout.eval SWEEP.yaml`` (see docs/eval.md)."""
