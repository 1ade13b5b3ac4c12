"""The same loop, a different rollout source: the RL loop's pieces spread over Ray actors.

``cluster.rollout_workers > 0`` has Ray actors (``rollout.RolloutWorker``) sample and grade
each epoch's batch with the trainer's current weights (``rollout.RayRolloutSource``); the
trainer still takes every optimizer step in this process. Ray is optional: ``pip install
'rlvr[ray]'``; nothing here imports it until a run asks for workers.
"""
