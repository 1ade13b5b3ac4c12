"""What the loop passes between its parts: one epoch's batch (``rollout.py``: Samples, Grades, Rollout), the
Policy and Task interfaces that make and grade it (``interfaces.py``) and a step's metrics record (``record.py``).
Nothing here imports another rlvr package.
"""
