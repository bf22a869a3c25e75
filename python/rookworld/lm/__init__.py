"""Using a trained model: loading it, its P: and A: answers, games, and the evaluation suites.

    from rookworld.lm import RookWorldLM
"""

from rookworld.lm.answers import GREEDY, PROTOCOLS, ROOKWORLD, Decoding, EnvAnswer, PolicyAnswer, RookWorldLM

__all__ = ["GREEDY", "PROTOCOLS", "ROOKWORLD", "Decoding", "EnvAnswer", "PolicyAnswer", "RookWorldLM"]
