"""rookworld's chess for other RL trainers: its verifiable rewards and its positions, in the shapes TRL, verifiers
and OpenEnv take. Each trainer's adapter is its own module and needs its own extra (`pip install
'rookworld[trl]'`); `rewards` needs nothing beyond rookworld itself. Nothing here is imported by the rest of
rookworld."""
