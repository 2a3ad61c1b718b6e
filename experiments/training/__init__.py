"""Training and evaluating the bundled draft/target pair: the source corpus and its
held-out split, the training script, and the acceptance evaluation."""
