"""A run on disk: ``launch.py`` starts and resumes runs, ``directory.py`` locks the run directory, ``checkpoint.py``
writes verified checkpoints, ``resume.py`` says what a resume may change, ``metrics.py`` writes, reads and plots
records, ``report.py`` and ``export.py`` are ``rlvr report`` and ``rlvr export``."""
