"""What each command does, one module a command (train and sft share one), run by `rookworld.cli` once the
command's flags are parsed."""
