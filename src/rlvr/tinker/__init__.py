"""A Tinker-compatible server over rlvr's models, losses, optimizer and engines (``rlvr tinker``): the ``tinker``
SDK and tinker-cookbook's recipes, pointed at it with ``base_url``, train on a laptop. docs/reference/tinker.md."""
