"""Settings: each declared once (type, default, help, check), in groups that every command composes, TOML
presets and files read into the same groups. Torch-free, so that parsing any command's flags loads no torch;
imports only `chess`."""
