"""Re-runs of the papers' analyses on real data (issue: experiments), one module per analysis.

Each analysis ``<name>`` has

* a library module ``uamt.experiments.<name>`` with the computation (a JSON-able findings dict) and
  ``render(result) -> str``, which renders the Jinja2 template ``templates/<name>.md.j2`` from that
  dict (:func:`uamt.experiments.rendering.render`; the markdown section of ``reports/experiments.md``:
  tables, links to figures, the comparison with the paper) -- the module selects, the template writes;
* the papers' numbers it quotes in ``paper_numbers.yaml`` (a source per group; :mod:`.paper_numbers`);
* a pipeline stage ``uamt.stages.exp_<name>`` (dvc stage ``exp_<name>`` = Prefect task = MLflow run
  name) whose ``run(cfg)`` calls the module's ``write_findings``, which writes
  ``metrics/experiments/<name>.json`` (DVC metrics) and its PNG figures under ``reports/figures/``
  (DVC plots); the module also holds the settings dataclass of its ``exp_<name>`` params section;
* the ``report`` stage assembles every section, in :data:`SECTIONS` order, into ``reports/experiments.md``.
"""

#: Analyses in report order (the dvc stage of each is ``exp_<name>``).
SECTIONS = ("methods", "noisy_refs", "ood", "references", "critical", "multihyp", "cost", "rerank", "flagging", "annotation", "sigma_weights")
