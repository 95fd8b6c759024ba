"""TopOSM tile programs on qbroker, one package per process: ``queuemaster``, ``renderer``, ``render_list``.

What they share with each other and with toposm-web and the Spark bridge is ``services.toposm``; ``data/`` is
the Mapnik style and the generated town. See docs/tiles.md. Entry points: ``toposm-queuemaster``,
``toposm-renderer`` and ``toposm-render-list`` (console scripts); ``demo.stack`` runs the first two for
scripts of your own.
"""
