"""GRPO: the objective decided from the config, rollouts, advantages and losses, the update, the trainer."""
