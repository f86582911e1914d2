"""Fine-tuning tasks: reading GLUE and SQuAD, turning them into fixed-length features, and decoding predictions."""
