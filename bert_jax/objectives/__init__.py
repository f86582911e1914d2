"""Loss and metrics per pretraining objective, as pure functions of (model outputs, batch).

`loss_fn(config, model)` gives the function the trainer differentiates:
(params, batch, rng, deterministic) -> (loss, metrics), with metrics["loss"] the total.
"""
from __future__ import annotations

import jax

from bert_jax.objectives import mlm, rtd, sentence_pair

OBJECTIVES = ("mlm", "mlm_nsp", "mlm_sop", "rtd")


def model_inputs(batch, deterministic: bool) -> dict:
    """The pipeline's batch keys under the models' argument names."""
    return dict(input_ids=batch["input_ids"], attention_mask=batch["input_mask"],
                token_type_ids=batch["segment_ids"], packing_segment_ids=batch.get("packing_segment_ids"),
                deterministic=deterministic)


def loss_fn(config, model):
    """The objective `config.objective` names, bound to `model` (PreTrainingModel, or Electra for rtd)."""
    objective = config.objective
    if objective not in OBJECTIVES:
        raise ValueError(f"config.objective={objective!r}: must be one of {OBJECTIVES}")

    def loss(params, batch, rng, deterministic: bool = False):
        variables = {"params": params}
        if objective == "rtd":
            # Separate dropout keys: the two passes run the shared embeddings, which would otherwise drop alike.
            gen_rng, disc_rng, sample_rng = jax.random.split(rng, 3)
            inputs = model_inputs(batch, deterministic)
            total, metrics = rtd.replaced_token_detection(
                lambda b: model.apply(variables, **inputs, masked_positions=b["masked_lm_positions"],
                                      rngs={"dropout": gen_rng}, method=model.generator_logits),
                lambda ids: model.apply(variables, **{**inputs, "input_ids": ids}, rngs={"dropout": disc_rng},
                                        method=model.discriminator_logits),
                batch, sample_rng, config.rtd_weight)
        else:
            outputs = model.apply(variables, **model_inputs(batch, deterministic),
                                  masked_positions=batch["masked_lm_positions"], rngs={"dropout": rng})
            total, metrics = mlm.masked_lm(outputs["mlm_logits"], batch)
            if objective != "mlm":
                pair_loss, pair_metrics = sentence_pair.sentence_pair(outputs["sentence_logits"], batch, objective[-3:])
                total, metrics = total + pair_loss, {**metrics, **pair_metrics}
        return total, {**metrics, "loss": total}

    return loss
