"""Training endpoints: the training loop, its optimisers and schedules, augmentation and mixup."""
