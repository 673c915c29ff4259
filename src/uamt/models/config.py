"""Hyper-parameters of the estimator family: the ``train_base:`` and ``train_dup:`` sections of params.yaml.

Both sections are read into the same frozen :class:`TrainConfig`; ``train_dup`` only sets the keys that
differ for the second DUP stage (method, pool, base model, loss, bottleneck).  Defaults follow
App. C of *Better Uncertainty Quantification for MT Evaluation* where they apply to the frozen-encoder
path (hidden sizes [3072, 1024], dropout 0.15, bottleneck 256, DUP loss L_HTS^E); the learning rate
and batch size of the frozen-encoder default are larger than the paper's fine-tuning values (3e-5,
batch 4) because only the head is trained there.  With ``finetune: true`` set the paper's values.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from uamt.core.config import DEFAULT_PARAMS, load_section

#: params.yaml sections this package reads.
BASE_SECTION = "train_base"
DUP_SECTION = "train_dup"


@dataclass(frozen=True)
class TrainConfig:
    """One estimator's training and inference settings.

    Attributes
    ----------
    method : str
        Key of :data:`uamt.models.specs.METHODS`.
    reference_free : bool
        QE variant on <src, mt> (features [mt, src, mt*src, |mt-src|]) instead of <src, mt, ref>.
    hidden_sizes, activations, dropout, layer_transformation
        COMET ``FeedForward`` / ``LayerwiseAttention`` settings.
    batch_size, learning_rate, max_epochs, patience, seed, deterministic, accelerator
        Training loop; early stopping watches the dev loss with ``patience`` epochs.
    mc_samples : int
        Stochastic passes for ``mcd_head`` / ``mcd_full`` / ``hts_mcd`` (paper: 100).
    mcd_scope : {"head", "full"}
        Where ``hts_mcd`` applies dropout at inference: head only (cached features) or the whole
        network including the encoder (needs the encoder).
    ensemble_size, ensemble_member, n_jobs
        Deep ensemble: K members of method ``ensemble_member`` trained with seeds seed..seed+K-1, in
        ``n_jobs`` parallel processes (with ``finetune``: one after another, each fine-tuning its own
        copy of the encoder).
    kl_missing_std : {"hts", "by_score", "mean", "floor", "drop"}
        How KL trains rows with fewer than 2 annotators (:data:`uamt.models.kl.MISSING_STD_RULES`):
        with the HTS loss on their one score (the default), a target std read off their score (binned
        on the multi-rater training rows), the training split's mean annotator std, the floor
        ``kl_std_floor``, or not at all (drop).
    kl_std_floor : float
        Lower bound on the KL target std, in ``score`` units (annotators who agree exactly would make
        log(sigma_hat^2 / sigma*^2) infinite).
    nll_beta : float
        beta of beta-NLL (Seitzer et al. 2022, :func:`uamt.models.losses.nll_weights`) for the
        methods trained with a Gaussian likelihood (``hts``, hence ``hts_mcd``, and ``kl``): each
        row's loss weighted by sigma_hat^(2 beta), held constant in the gradient, so hard rows still
        pull mu.  0 = the papers' Eq. 2 / Eq. 3; in [0, 1].  Not read by DUP's second stage.
    synthetic_nll_beta : float or None
        The beta-NLL beta of the synthetic failure rows alone (``synthetic_failures``; the natural
        rows keep ``nll_beta``).  Under Eq. 2 a critical error trained at the worst score is
        explained by a large sigma and moves mu only a few points; 1 gives those rows the squared
        error's gradient for mu while the natural rows keep the papers' loss.  None = ``nll_beta``.
    dup_loss : {"abs", "sq", "hts"}
        DUP second-stage loss (Eqs. 5, 6, 7).
    bottleneck_size : int
        DUP bottleneck layer, where q_hat enters (App. C: 256).
    base_model_dir : str or None
        DUP: the trained first-stage model M_Q.
    finetune, encoder_learning_rate, layerwise_decay, nr_frozen_epochs, keep_embeddings_frozen
        Encoder-in-the-network path (GPU users): COMET's layer-wise learning-rate decay and a frozen
        encoder for the first ``nr_frozen_epochs`` epochs (fractions allowed).
    finetune_top_layers : int
        With ``finetune``: 0 trains every encoder block; k >= 1 trains only the top k transformer
        blocks (the rest stays frozen), each step running just those blocks on states of the lower
        layers computed once per text (:mod:`uamt.models.top_layers`, the CPU route).  The model is
        served as any fine-tuned one.
    predict_batch_size : int
        Rows per forward pass at inference.
    synthetic_failures : float
        Share of synthetic failure rows added to the training split by the ``train_base`` stage
        (MetricX-23's recipe, :func:`uamt.challenge.with_synthetic_failures`): this many rows of
        critical errors (omission, duplication, unrelated sentence, gibberish, untranslated, wrong
        language) at the worst score of the dataset's scale, and as many references copied as the
        translation at its best score.  0 = none.
    row_features : tuple of str
        Surface features of each row (:data:`uamt.surface_features.FEATURES`: ``chrf``, ``ter``,
        ``len_ratio_ref``, ``len_ratio_src``, ``copy_rate``, ``target_language_prob``,
        ``number_mismatch_ref``, ``number_mismatch_src``, ``negation_mismatch_ref``,
        ``negation_mismatch_src``, ``sentence_ratio_ref``) that the head
        reads beside the COMET features (:mod:`uamt.models.row_features`; computed from the texts
        wherever rows are encoded).  () = none (the COMET head).  A reference-free model cannot read
        the reference-based ones.
    paragraph_units : bool
        Score a multi-sentence row sentence by sentence too (:mod:`uamt.paragraphs`): after training,
        a blend of the whole row's μ, the sum of its aligned sentence units' μ and the counts of
        unaligned reference and translation sentences is fitted per language pair on the rows of
        ``paragraph_splits``, adopted where an F-test says the units add to the whole-row μ, and
        recorded in the model's manifest; ``predict`` returns it as ``mu``.  A reference-free
        model aligns the translation's sentences to the source's by length instead.
    paragraph_splits : tuple of str
        The prepared splits the blend is fitted on, less every split that trained the model or a
        model it builds on (the pipeline's stages drop those; :func:`uamt.models.api.train` takes
        the rows, ``dev_df`` by default).  dev alone held 389 en-de multi-sentence rows from 18
        documents; dev + d_e hold 1,807 (docs/quality.md).
    init_from : str or None
        A trained single-network model folder whose weights start the training (a warm start: the
        "DA first, then MQM" recipe of COMET and MetricX trains once on direct assessments, then on
        MQM from there).  Its method family's head, layers, hidden sizes and input side must match;
        its target scaling is not reused (each training standardises its own targets).  None = the
        seed's random initialisation.
    train_split, dev_split, out_dir
        CLI / pipeline: the prepared splits to train on and stop on, and where the model goes
        (``{method}`` is replaced by the method name).
    """

    method: str = "point"
    reference_free: bool = False
    hidden_sizes: tuple[int, ...] = (3072, 1024)
    activations: str = "Tanh"
    dropout: float = 0.15
    layer_transformation: Literal["softmax", "sparsemax"] = "softmax"
    batch_size: int = 32
    learning_rate: float = 1e-4
    max_epochs: int = 10
    patience: int = 2
    seed: int = 42
    deterministic: bool = True
    accelerator: str = "cpu"
    mc_samples: int = 100
    mcd_scope: Literal["head", "full"] = "head"
    ensemble_size: int = 5
    ensemble_member: str = "point"
    n_jobs: int = 1
    kl_missing_std: Literal["hts", "by_score", "mean", "floor", "drop"] = "hts"
    kl_std_floor: float = 0.01
    nll_beta: float = 0.0
    synthetic_nll_beta: float | None = None
    dup_loss: str = "hts"
    bottleneck_size: int = 256
    base_model_dir: str | None = None
    finetune: bool = False
    encoder_learning_rate: float = 1e-5
    layerwise_decay: float = 0.95
    nr_frozen_epochs: float = 0.3
    keep_embeddings_frozen: bool = True
    finetune_top_layers: int = 0
    predict_batch_size: int = 256
    synthetic_failures: float = 0.0
    row_features: tuple[str, ...] = ()
    paragraph_units: bool = False
    paragraph_splits: tuple[str, ...] = ("dev",)
    init_from: str | None = None
    train_split: str = "d_q"
    dev_split: str = "dev"
    out_dir: str = "models/{method}"

    def __post_init__(self) -> None:
        from uamt.models.row_features import check_row_features

        check_row_features(self.row_features, self.reference_free)
        if not 0.0 <= self.nll_beta <= 1.0:
            raise ValueError(f"nll_beta={self.nll_beta}: must be in [0, 1] (0 = Eq. 2, 1 = the squared error's gradient for mu)")
        if self.synthetic_nll_beta is not None and not 0.0 <= self.synthetic_nll_beta <= 1.0:
            raise ValueError(f"synthetic_nll_beta={self.synthetic_nll_beta}: must be in [0, 1] or null (= nll_beta)")
        if self.finetune_top_layers < 0:
            raise ValueError(f"finetune_top_layers={self.finetune_top_layers}: 0 (every block) or the number of top blocks")
        if self.finetune_top_layers and not self.finetune:
            raise ValueError(f"finetune_top_layers={self.finetune_top_layers} needs finetune: true")

    def as_reference_free(self) -> TrainConfig:
        """This config for the reference-free (QE) variant on <src, mt>: the row features read off
        the reference (chrF, TER, the reference length ratio) are left out, the others kept."""
        from uamt.surface_features import NEEDS_REFERENCE

        return self.replace(
            reference_free=True, row_features=[name for name in self.row_features if name not in NEEDS_REFERENCE]
        )

    def replace(self, **changes) -> TrainConfig:
        """A copy with ``changes`` applied (validated like the YAML)."""
        import dataclasses

        from uamt.core.config import from_dict

        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        values.update(changes)
        values = {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}
        return from_dict(TrainConfig, values, where="TrainConfig")


def load_train_config(method: str, path: str | Path = DEFAULT_PARAMS) -> TrainConfig:
    """The config for ``method``: ``train_dup`` over ``train_base`` for a second-stage method (DUP),
    ``train_base`` otherwise; unknown methods raise ValueError listing the choices."""
    from uamt.core.config import from_dict, read_params
    from uamt.models.specs import get_spec

    base = load_section(TrainConfig, BASE_SECTION, path)
    if get_spec(method).layout != "second_stage":
        return base.replace(method=method, out_dir=_default_out(base.out_dir, method))
    params = read_params(path)
    dup_values = params.get(DUP_SECTION) or {}
    # Validate the DUP section on its own first so an error names train_dup.<key>.
    from_dict(TrainConfig, dup_values, where=f"{path}:{DUP_SECTION}")
    return base.replace(**{"out_dir": _default_out("models/{method}", method), **dup_values, "method": method})


def _default_out(out_dir: str, method: str) -> str:
    return out_dir.replace("{method}", method)
