"""Pipeline steps: one module per dvc stage, each with ``run(cfg, ...) -> outputs`` and ``main(argv)``."""
