"""What every part of rlvr uses, below all of them: the one-line errors and the run's stop signal (``errors.py``),
the rules a setting or task option declares (``rules.py``), the optional installs each back end needs
(``extras.py``), data files (``data.py``), the limits and jails of the processes rlvr starts (``processes.py``)
and the worker pool that runs reward functions, tools and environments (``workers.py``). Nothing here imports
another rlvr package.
"""
