"""Benchmarks: each times our way against a baseline in the same run (these machines are noisy, so the
ratio is the result) and prints a table; most also write JSON. Not part of the library: nothing under
``sandboxes/``, ``rollout/``, ``learner/``, ``teachers/`` or ``distill/`` imports them.

================================  =============================================================================
``benches.sandbox``               ``agentenv sandbox bench``: sandbox hot paths vs the plain ``docker`` SDK
``benches.rollout``               ``agentenv rollout bench``: Ray rollout vs ``benches.rollout_baseline``
``benches.rollout_baseline``      the sequential plain-``docker`` baseline of ``agentenv rollout bench``
``benches.gateway``               ``python -m benches.gateway``: real agent CLIs through the gateway vs the
                                  emulated harness of the same surface
``benches.eval``                  ``python -m benches.eval``: the eval sweep vs ``agentenv rollout``
``benches.engine``                ``python -m benches.engine runners|async``: Ray vs in-process runner;
                                  staleness 0 vs 1 vs 2
``benches.learner_step``          ``python -m benches.learner_step``: LM head at loss tokens only vs everywhere
``benches.determinism``           ``python -m benches.determinism``: deterministic kernels on vs off
``benches.learner_gpu``           ``python -m benches.learner_gpu``: packed trainer step vs a padded HF loop
``benches.publish``               ``python -m benches.publish``: weights through the Ray object store vs a
                                  checkpoint reload
``benches.distill_gpu``           ``python -m benches.distill_gpu``: LoRA teachers vs full copies; MOPD vs RL
``benches.sharded_learner``       ``python -m benches.sharded_learner``: the FSDP2-sharded learner at world size 1
                                  vs the fast path (tokens/s, MFU, peak memory)
``benches.bounds``                ``python -m benches.bounds``: the host-side bounds of issue 26 (no-follow FAST
                                  pack, bounded SQLite dump) vs the unbounded ways
================================  =============================================================================
"""
