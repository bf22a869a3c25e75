"""The ground every other layer stands on: chess rules (from the Rust core), rewards, Stockfish, position
files, atomic writes and progress bars. Imports nothing of rookworld but `_core`; needs no torch."""
