"""The parts of examples/train_lm.py: corpus, model, attention choices, training loop and report."""
