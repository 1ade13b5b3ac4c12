"""A run on disk: ``launch.py`` starts and resumes runs (``stops.py``: progress and stop
signals), ``directory.py`` (the locked run directory), ``checkpoint.py`` (atomic, verified
checkpoints), ``resume.py`` (what a resume may change), ``metrics.py`` (sinks, reading
records back, plots), ``reading.py`` (a run directory as the report reads it), ``report.py``
(``rlvr report``) and ``export.py`` (``rlvr export``).
"""
