"""Training: the loss, learning-rate schedules, and the training loop (`nmtkit train`)."""
