"""Whether the dtype of ``batch.x`` fits the trainer's precision, checked when the DataModule is set up.

``x_dtype: float16`` with Lightning's default ``precision: 32-true`` hands a float32 model half-precision rows: its
first layer dies with ``RuntimeError: mat1 and mat2 must have the same dtype``. A ``-true`` precision (``16-true``,
``bf16-true``) runs the model in that dtype, and Lightning does not cast a PyG batch's ``x``, so ``x`` must be in it;
a ``-mixed`` precision autocasts, and takes any ``x``. :func:`check_x_dtype_fits_precision` says in one line which
``trainer.precision`` (or ``x_dtype``) the choice needs.
"""

from __future__ import annotations

from typing import Optional

from lightning_zerocopy.options import RecipeError

__all__ = ["check_x_dtype_fits_precision"]

#: The dtype a ``-true`` precision runs the model in; a ``-mixed`` one (or another plugin) is not listed: any x runs.
_MODEL_DTYPE = {"32-true": "float32", "32": "float32", "16-true": "float16", "bf16-true": "bfloat16"}
_MIXED = {"float16": "16-mixed", "bfloat16": "bf16-mixed", "float32": "bf16-mixed"}
_TRUE = {"float16": "16-true", "bfloat16": "bf16-true"}


def check_x_dtype_fits_precision(x_dtype: Optional[str], feature_dtype: Optional[str], precision: Optional[str],
                                 key_prefix: str) -> None:  # fmt: skip
    """Raise when ``batch.x`` (``x_dtype``; ``None``: the stored ``feature_dtype``) is not the dtype the model runs
    in under ``precision`` (the trainer's, e.g. ``"32-true"``); unknown dtypes or precisions pass.

    Args:
        key_prefix: the DataModule's YAML prefix (``data.init_args.``), for the message.

    Raises:
        RecipeError: one line naming ``trainer.precision`` and the ``x_dtype`` key, and what to set.
    """
    effective = x_dtype if x_dtype is not None else feature_dtype
    model = _MODEL_DTYPE.get(str(precision))
    if effective is None or model is None or effective == model:
        return
    chosen = (f"{key_prefix}x_dtype: {effective}" if x_dtype is not None
              else f"{key_prefix}x_dtype: null with {key_prefix}feature_dtype: {effective}")  # fmt: skip
    if model == "float32":
        fix = (f"set trainer.precision to {_MIXED[effective]} (or {_TRUE[effective]}), or {key_prefix}x_dtype to "
               "float32")  # fmt: skip
        why = "(its first layer fails: 'mat1 and mat2 must have the same dtype')"
    else:
        fix = f"set {key_prefix}x_dtype to {model}, or trainer.precision to {_MIXED[model]}"
        why = "and Lightning does not cast a PyG batch's x"
    raise RecipeError(f"{chosen} makes batch.x {effective}, but trainer.precision {precision} runs the model in "
                      f"{model} {why}; {fix}")  # fmt: skip
