"""Plain input and output every layer shares, chess or not: files written atomically and read a bounded line at a
time (`files`), what a message quotes of its input (`quote`), and progress lines (`progress`)."""
