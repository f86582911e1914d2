"""bert_jax: BERT, RoBERTa, ALBERT and ELECTRA in JAX/Flax."""
