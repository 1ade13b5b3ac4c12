"""The training loop and one step of it: ``trainer.py`` (the loop on one page), ``seams.py`` (the rollout source and
learner it calls), ``step.py`` (one optimizer step, the same in every learner), ``state.py``, ``optim.py``,
``evaluation.py``, ``shaping.py`` (reward shaping before the deltas), ``dynamic_sampling.py``, ``diagnostics.py`` (the
measurements a step takes) and ``sft.py`` (the supervised warm start). Nothing here writes a run directory or imports
the cluster.
"""
