"""Pure analyses: a Timeline in, typed findings out. No I/O, no printing."""
