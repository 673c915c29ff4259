"""unbabel-comet's ``FeedForward`` and ``LayerwiseAttention``, without importing the ``comet`` package.

``import comet.modules`` runs ``comet/__init__.py``, which imports ``comet.models`` and with it
pytorch-lightning, torchmetrics and transformers: about 5 s and 300 MB that scoring (a trained
head on embeddings) does not need.  The two modules themselves import only torch, so they are
loaded straight from the installed unbabel-comet's files.  Where ``comet.modules`` is already
imported (training), its own classes are used.  The classes' code, and so the weights' layout,
is unbabel-comet's either way.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

from uamt.core.errors import UamtError


def _comet_module(name: str) -> ModuleType:
    """``comet.modules.<name>``: the imported one, else loaded from its file under a private name."""
    imported = sys.modules.get(f"comet.modules.{name}")
    if imported is not None:
        return imported
    private = f"uamt.models._comet_{name}"
    if private in sys.modules:
        return sys.modules[private]
    package = importlib.util.find_spec("comet")  # locates the package without running its __init__
    if package is None or not package.submodule_search_locations:
        # Scoring needs only the two module files: with its dependencies unbabel-comet would install
        # pytorch-lightning, transformers and torchmetrics, which a scoring install leaves out.
        raise UamtError(
            "unbabel-comet is not installed: pip install --no-deps unbabel-comet==2.2.7 (scoring reads "
            'two of its module files; the training pipeline installs it with pip install ".[pipeline]")'
        )
    path = Path(next(iter(package.submodule_search_locations))) / "modules" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(private, path)
    if spec is None or spec.loader is None or not path.is_file():
        raise UamtError(f"{path}: unbabel-comet's {name} module is missing")
    module = importlib.util.module_from_spec(spec)
    sys.modules[private] = module
    spec.loader.exec_module(module)
    return module


FeedForward = _comet_module("feedforward").FeedForward
LayerwiseAttention = _comet_module("layerwise_attention").LayerwiseAttention


def _first_dropout(ff) -> int:
    """Index in ``ff.ff`` (the ``nn.Sequential``) of the first ``Dropout``; its length if none."""
    return next((i for i, layer in enumerate(ff.ff) if isinstance(layer, nn.Dropout)), len(ff.ff))


def feedforward_until_dropout(ff, features: torch.Tensor) -> torch.Tensor:
    """The deterministic start of COMET's ``FeedForward`` (every layer before its first ``Dropout``).

    ``feedforward_from_dropout(ff, feedforward_until_dropout(ff, x))`` runs the same layers in the
    same order as ``ff(x)``; MC dropout computes this part once per row and repeats only its output.

    Parameters
    ----------
    ff : FeedForward
    features : torch.Tensor
        [B, in_dim].

    Returns
    -------
    torch.Tensor
        [B, hidden_sizes[0]]: the first Linear and its activation.
    """
    # The half-precision cast FeedForward.forward does, so a float16 head takes the same path.
    if {param.dtype for param in ff.ff.parameters()} == {torch.float16} and features.dtype != torch.float16:
        features = features.to(torch.float16)
    return ff.ff[: _first_dropout(ff)](features)


def feedforward_from_dropout(ff, hidden: torch.Tensor) -> torch.Tensor:
    """The rest of COMET's ``FeedForward``, from its first ``Dropout`` on, over
    :func:`feedforward_until_dropout`'s output (possibly repeated, one copy per MC pass).

    Parameters
    ----------
    ff : FeedForward
    hidden : torch.Tensor
        [N, hidden_sizes[0]].

    Returns
    -------
    torch.Tensor
        [N, out_dim].
    """
    return ff.ff[_first_dropout(ff) :](hidden)


__all__ = ["FeedForward", "LayerwiseAttention", "feedforward_from_dropout", "feedforward_until_dropout"]
