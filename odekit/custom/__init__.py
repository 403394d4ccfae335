"""Custom-derivative building blocks: the PyLayer-style Function and the
implicit-function-theorem rule shared by fixed_point and root."""
