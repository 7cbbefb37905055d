"""Recipes: one folder each, with its config, its runner and a README giving the command and the expected
result. Run from the repository root: ``python -m examples.<recipe>.run ...`` (the README of each says how).
Not part of the installed package; the plain configs beside the folders (quickstart.yaml, rollout.yaml, ...)
are read by the ``agentenv`` commands directly."""
