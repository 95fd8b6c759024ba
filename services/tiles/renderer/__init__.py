"""The renderer process: render threads on one qbroker Unit, each rendering in a worker process.

``process`` is the bus side, ``worker`` what runs in the worker processes, ``backends`` what draws, ``main``
is ``toposm-renderer``.
"""
