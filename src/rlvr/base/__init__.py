"""What every part of rlvr shares, below all of them: the batch and the Policy and Task
interfaces (``rollout.py``), the one-line errors (``errors.py``), a metrics record
(``record.py``), the rules a setting or task option declares (``rules.py``), the generic
config loader (``settings.py``, with TRL's and verl's names in ``trl_names.py``), the
optional installs each back end needs (``extras.py``), data files (``data.py``), model
loading (``modeling.py``) and the limits of the programs jails start (``processes.py``).
Nothing here imports another rlvr package but ``rlvr.core``.
"""
