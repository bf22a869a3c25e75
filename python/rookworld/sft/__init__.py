"""SFT: supervised training on P:/A: text, as RookWorld-LM itself was made."""
