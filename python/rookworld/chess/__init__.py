"""The chess domain every other layer stands on: the rules (from the Rust core), rewards, Stockfish and position
files. Imports nothing of rookworld but `_core` and `io`; needs no torch."""
