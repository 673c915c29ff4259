"""Decisions from the served distribution: choose among candidates, flag for post-editing, pick rows
to annotate.

Every number a decision reads comes from the served calibration of a model (its centre mu, its
central interval at a level, its CDF P(Q <= chi): :class:`uamt.serving.model_calibration.Calibration`), clipped
to the scale's bounds as ``uamt score`` serves it; never from a Gaussian stand-in.

* :mod:`uamt.decisions.rerank` -- per group of candidate translations of one source, the chosen
  candidate under a rule (``mu``, ``lcb``, ``risk``, ``mbr``, ``mbr_lcb``) and whether to abstain.
* :mod:`uamt.decisions.flagging` -- flags from the served risk, and the risk threshold chosen on dev
  by conformal risk control (share of bad translations left unflagged <= alpha).
* :mod:`uamt.decisions.annotation` -- rows to send to annotators: epistemic sigma with diversity
  over documents and LPs, written in the incoming-annotations format.
"""
